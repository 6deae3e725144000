// StateSlotPool: hands out per-need state slots and files fork checkpoints.
//
// A slot is one complete recurrent state. A live request holds 1 + num_spec
// of them (committed state plus speculative rollback); a checkpoint holds one.
// Speculative checkpoints (guesses rather than a prompt's own end) are filed at
// the LRU head so a shortage spends them first. Midstep checkpoints are taken
// in two moments: reserve before the forward, publish once the bytes exist.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "core/checkpoint_pool.h"
#include "core/errors.h"
#include "core/sequence.h"
#include "core/slot_source.h"
#include "core/state_transfer.h"

namespace statecache {

struct MidstepReservation {
  int64_t slot = -1;
  int64_t position = 0;
  int64_t hash = -1;
  bool operator==(const MidstepReservation&) const = default;
};

// What retire_top did to the slot pool (see Retirement).
struct SlotRetirement : Retirement {};

class StateSlotPool : public CheckpointPool<SlotRetirement>, public ScratchSlotSource {
 public:
  // std::invalid_argument for a copy transfer, a negative count or a
  // hash_block_size < 1.
  explicit StateSlotPool(int64_t num_slots, StateTransfer transfer = StateTransfer(), int64_t hash_block_size = 1,
                         bool enabled = true);

  // ScratchSlotSource (the PAGE coordinator's midstep scratch).
  bool has_free(int64_t count = 1) const override { return StateFreeList::has_free(count); }
  int64_t pop() override { return StateFreeList::pop(); }
  void release(int64_t slot) override { StateFreeList::release(slot); }

  // One request's set, element 0 first. std::out_of_range (nothing taken)
  // when fewer than `count` are free.
  std::vector<int64_t> pop_many(int64_t count);

  // Fork checkpoint: the owner moves to a fresh slot, the old one is filed
  // under `h` and pinned until the batch the next pass builds has read it.
  void checkpoint(Sequence& seq, int64_t boundary_blocks, int64_t h);
  // checkpoint(*seqs[i], boundary_blocks[i], hashes[i]) for each i, the whole
  // batch checked first (core/batch.h); keys[i] is seqs[i]'s identity.
  void checkpoint_many(std::span<Sequence* const> seqs, std::span<const uintptr_t> keys,
                       std::span<const int64_t> boundary_blocks, std::span<const int64_t> hashes);
  // What checkpoint checks before it changes anything; throws as it would.
  void check_checkpoint(const Sequence& seq, int64_t h) const;
  // checkpoint in two steps: the decision (validates, changes nothing) and
  // its execution on the same sequence fields.
  ForkPlan plan_checkpoint(const Sequence& seq, int64_t h);
  void apply_checkpoint(Sequence& seq, const ForkPlan& plan, int64_t boundary_blocks, int64_t h);

  std::vector<MidstepReservation> reserve_midstep(const Sequence& seq,
                                                  std::span<const std::pair<int64_t, int64_t>> positions);
  // Both take only rows that are live reservations of this pool (handed out
  // by reserve_midstep, not published, cancelled or released since), all
  // checked before anything changes. `seq` may be null: nothing is demoted.
  void publish_midstep(std::span<const MidstepReservation> reservations, const Sequence* seq);
  void cancel_midstep(std::span<const MidstepReservation> reservations);
  bool is_reserved(int64_t slot) const;

  // As the free list's, and a reservation on a relocated top moves with it.
  std::optional<SlotRetirement> retire_top();

  void record_relocation(int64_t src, int64_t dst);
  std::vector<std::pair<int64_t, int64_t>> take_relocations();
  const std::vector<std::pair<int64_t, int64_t>>& pending_relocations() const { return relocations_; }

 private:
  // The position this sequence knows is a resume point; 0 means none.
  static int64_t anchor_of(const Sequence& seq) {
    return seq.midstep_anchor_pos != 0 ? seq.midstep_anchor_pos : seq.checkpoint_end_pos;
  }
  void check_returnable(std::span<const MidstepReservation> reservations) const;
  void set_reserved(int64_t slot, bool reserved);

  std::vector<std::pair<int64_t, int64_t>> relocations_;
  // release_epoch + 1 of each slot when reserve_midstep handed it out, else 0.
  std::vector<uint32_t> reserved_at_;
};

}  // namespace statecache
