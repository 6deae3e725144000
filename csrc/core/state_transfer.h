// How a backend hands one request's state to a checkpoint (docs/contract.md, "Words", "Objects").
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>

namespace statecache {

enum class TransferKind : uint8_t { kNone, kFork, kCopy, kReplay };

const char* transfer_kind_name(TransferKind kind);
// Parses "none" / "fork" / "copy" / "replay"; std::invalid_argument otherwise.
TransferKind parse_transfer_kind(const std::string& name);

struct StateTransfer {
  TransferKind kind = TransferKind::kNone;
  int64_t fork_tokens = 0;
  std::optional<std::string> paged_layout_id;
  bool readable_midstep = false;

  // Validates the combination; throws std::invalid_argument naming the field.
  StateTransfer(TransferKind kind = TransferKind::kNone, int64_t fork_tokens = 0,
                std::optional<std::string> paged_layout_id = std::nullopt, bool readable_midstep = false);

  bool copies() const { return kind == TransferKind::kCopy; }
  bool forks() const { return kind == TransferKind::kFork; }
  bool replays() const { return kind == TransferKind::kReplay; }
  // Tokens the forward after a checkpoint must commit: inf where nothing can be
  // handed over (none) or nothing needs to be (replay).
  double successor_room() const {
    if (kind == TransferKind::kNone || kind == TransferKind::kReplay) return std::numeric_limits<double>::infinity();
    return static_cast<double>(fork_tokens);
  }

  bool operator==(const StateTransfer&) const = default;
};

}  // namespace statecache
