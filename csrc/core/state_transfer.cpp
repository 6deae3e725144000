#include "core/state_transfer.h"

#include "core/errors.h"

namespace statecache {

const char* transfer_kind_name(TransferKind kind) {
  switch (kind) {
    case TransferKind::kNone:
      return "none";
    case TransferKind::kFork:
      return "fork";
    case TransferKind::kCopy:
      return "copy";
    case TransferKind::kReplay:
      return "replay";
  }
  return "none";
}

TransferKind parse_transfer_kind(const std::string& name) {
  if (name == "none") return TransferKind::kNone;
  if (name == "fork") return TransferKind::kFork;
  if (name == "copy") return TransferKind::kCopy;
  if (name == "replay") return TransferKind::kReplay;
  bad_argument("kind", "'" + name + "'", "expected 'none', 'fork', 'copy' or 'replay'");
}

StateTransfer::StateTransfer(TransferKind kind_, int64_t fork_tokens_, std::optional<std::string> layout_id,
                             bool readable)
    : kind(kind_), fork_tokens(fork_tokens_), paged_layout_id(std::move(layout_id)), readable_midstep(readable) {
  if (kind == TransferKind::kFork) {
    if (fork_tokens <= 0)
      bad_argument("fork_tokens", fork_tokens, "a fork binds its successor forward, so it needs > 0");
  } else if (fork_tokens != 0) {
    bad_argument("fork_tokens", fork_tokens, "only a fork transfer carries fork tokens");
  }
  if (paged_layout_id && kind != TransferKind::kCopy)
    bad_argument("paged_layout_id", "'" + *paged_layout_id + "'", "only a copy transfer has a page layout");
  if (paged_layout_id && paged_layout_id->empty())
    bad_argument("paged_layout_id", "''", "must be non-empty when given");
  if (readable && (kind == TransferKind::kNone || kind == TransferKind::kReplay))
    bad_argument("readable_midstep", 1, "none and replay transfers keep no interior state");
}

}  // namespace statecache
