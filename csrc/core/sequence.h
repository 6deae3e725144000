// The per-request fields the state caches read and write (docs/contract.md, "API guarantees").
//
// Pools that remember a sequence across calls hold a std::shared_ptr to it, so
// a Python object dropped by the engine never leaves them a dangling pointer.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/hash_form.h"

namespace statecache {

struct Sequence {
  std::optional<int64_t> seq_id;
  int64_t num_tokens = 0;
  int64_t num_prompt_tokens = 0;
  bool has_per_req_cache = true;
  // Element 0 is the committed state; 1..n are speculative rollback slots.
  std::vector<int64_t> state_slots;
  int64_t state_fork_src = -1;
  int64_t per_req_cache_group = -1;
  int64_t pending_checkpoint = -1;
  int64_t checkpoint_end_pos = 0;
  int64_t midstep_anchor_pos = 0;
  std::vector<int64_t> block_hashes;
  // The form its hashes (block_hashes, pending_checkpoint) were given in.
  HashForm hash_form;

  int64_t state_slot() const { return state_slots.empty() ? -1 : state_slots.front(); }
  void set_state_slot(int64_t slot) {
    if (state_slots.empty())
      state_slots.push_back(slot);
    else
      state_slots.front() = slot;
  }
};

}  // namespace statecache
