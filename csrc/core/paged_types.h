// Value types of PAGE checkpoints (docs/contract.md, "API guarantees"): the image geometry, the
// store / restore copies the runner executes, the store's records and the
// identity of one offload store attempt.
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace statecache {

enum class CheckpointState : uint8_t { kCopying, kReady, kEvicting };

// "COPYING" / "READY" / "EVICTING".
const char* checkpoint_state_name(CheckpointState state);
// The inverse; std::invalid_argument for any other string.
CheckpointState parse_checkpoint_state(const std::string& name);

using UnitIds = std::vector<int64_t>;

// Geometry of one image: `image_bytes` of a `slot_bytes` slot, scattered into
// page units of `page_unit_bytes`, tagged with the layout that produced it.
struct PagedStateCheckpointSpec {
  int64_t page_unit_bytes = 0;
  int64_t slot_bytes = 0;
  std::string layout_id;
  int64_t image_bytes = 0;

  // Validates: the three sizes positive, image within the slot, layout named.
  PagedStateCheckpointSpec(int64_t page_unit_bytes, int64_t slot_bytes, std::string layout_id, int64_t image_bytes);

  // ceil(image_bytes / page_unit_bytes), without overflowing near INT64_MAX.
  int64_t units_per_checkpoint() const {
    return image_bytes / page_unit_bytes + (image_bytes % page_unit_bytes != 0 ? 1 : 0);
  }
  bool operator==(const PagedStateCheckpointSpec&) const = default;
};

// Scatter the image part of `src_slot` into `unit_ids`, in order.
struct CheckpointStoreOp {
  int64_t src_slot = -1;
  UnitIds unit_ids;
  int64_t total_bytes = 0;
  std::string layout_id;
  bool operator==(const CheckpointStoreOp&) const = default;
};

// Gather `unit_ids`, in order, back into `dst_slot`.
struct CheckpointRestoreOp {
  int64_t dst_slot = -1;
  UnitIds unit_ids;
  int64_t total_bytes = 0;
  std::string layout_id;
  bool operator==(const CheckpointRestoreOp&) const = default;
};

struct CheckpointRecord {
  int64_t prefix_hash = -1;
  UnitIds unit_ids;
  CheckpointState state = CheckpointState::kCopying;
  int64_t pin_count = 0;
  bool operator==(const CheckpointRecord&) const = default;
};

// A queued restore taken off the next batch; it keeps its record pinned.
struct SuspendedCheckpointRestore {
  int64_t checkpoint_id = -1;
  CheckpointRestoreOp operation;
  bool operator==(const SuspendedCheckpointRestore&) const = default;
};

// One attempt at storing a hash in a tier. The generation tells apart a
// prefix stored again after an eviction from the earlier attempt.
struct StateStoreOperationId {
  int64_t prefix_hash = -1;
  int64_t generation = 0;
  bool operator==(const StateStoreOperationId&) const = default;
};

struct StateStoreOperationIdHash {
  size_t operator()(const StateStoreOperationId& op) const noexcept {
    const uint64_t h = static_cast<uint64_t>(op.prefix_hash) * 0x9E3779B97F4A7C15ull;
    return static_cast<size_t>(h ^ (static_cast<uint64_t>(op.generation) + (h << 6) + (h >> 2)));
  }
};

// Descriptor entries one batch holds: one store and one restore per sequence.
// std::overflow_error when twice `max_num_seqs` does not fit.
inline int64_t checkpoint_copy_ops_per_batch(int64_t max_num_seqs) {
  int64_t out = 0;
  if (__builtin_mul_overflow(max_num_seqs, int64_t{2}, &out))
    throw std::overflow_error("max_num_seqs=" + std::to_string(max_num_seqs) +
                              ": twice it does not fit in a signed 64-bit int");
  return out;
}

}  // namespace statecache
