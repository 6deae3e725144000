// Span planner: validates one batch of state maintenance ops and compiles it
// into one small descriptor per op; the CPU runner and the GPU kernel expand
// (op, template piece) into addresses with the same function, resolve().
//
// Geometry comes in as segment tables of plain integers (addresses and byte
// strides), so this file knows nothing of torch or of devices: item i of a
// segment (a slot, or a page unit) lives at `base + i * stride`, `bytes` long.
//   * slot image segments: the bytes of one slot that a PAGE image holds, in
//     image order;
//   * slot segments: every byte of one slot (what relocations and group copies
//     move);
//   * unit segments: the bytes of one page unit, in order.
// The image walks the unit list in order: unit k of an op holds image bytes
// [k * unit_bytes, (k + 1) * unit_bytes). The intersection of the two walks is
// computed once per layout (the paged template); a batch only names slots and
// units, so host work per batch is O(ops + unit ids), never O(spans).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define SC_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define SC_HOST_DEVICE inline
#endif

namespace statecache {

struct Segment {
  uint64_t base = 0;
  int64_t stride = 0;
  int64_t bytes = 0;
};

// One piece of a per-layout template: `bytes` at `slot_base + slot * slot_stride`
// on the slot side and `other_base + other * other_stride` on the other side,
// where `other` is the op's unit `unit_k` (paged ops) or its second slot
// (slot copies, unit_k < 0).
struct TemplatePiece {
  uint64_t slot_base;
  uint64_t other_base;
  int64_t slot_stride;
  int64_t other_stride;
  uint32_t bytes;
  int32_t unit_k;
};
static_assert(sizeof(TemplatePiece) == 40, "descriptor layout is shared with the device");

// One op of a compiled batch (24 bytes, shared with the device).
struct OpDesc {
  int64_t slot;      // store: source slot; restore: destination slot; pair: source slot
  int64_t other;     // pair: destination slot; paged: offset of its ids in the batch's unit list
  uint32_t to_slot;  // 1: bytes move other -> slot (a restore)
  uint32_t paged;    // 1: the paged template, 0: the whole-slot template
};
static_assert(sizeof(OpDesc) == 24, "descriptor layout is shared with the device");

// The addresses one piece of one op moves between.
SC_HOST_DEVICE void resolve(const TemplatePiece& p, const OpDesc& op, const int32_t* unit_ids, uint64_t& src,
                            uint64_t& dst) {
  const uint64_t a = p.slot_base + static_cast<uint64_t>(op.slot) * static_cast<uint64_t>(p.slot_stride);
  const int64_t other = p.unit_k >= 0 ? unit_ids[op.other + p.unit_k] : op.other;
  const uint64_t b = p.other_base + static_cast<uint64_t>(other) * static_cast<uint64_t>(p.other_stride);
  src = op.to_slot ? b : a;
  dst = op.to_slot ? a : b;
}

// A store (slot -> units) or restore (units -> slot) as the planner sees it.
struct PagedCopyOp {
  int64_t slot = -1;
  std::vector<int64_t> unit_ids;
  int64_t total_bytes = 0;
  std::string layout_id;
};

struct SlotCopyOp {
  int64_t src = -1;
  int64_t dst = -1;
};

// The maintenance ops of one batch, in the order docs/contract.md, "The pass" issues them.
struct MaintenanceBatch {
  std::vector<SlotCopyOp> relocations;
  std::vector<SlotCopyOp> copies;
  std::vector<PagedCopyOp> stores;
  std::vector<PagedCopyOp> restores;
};

// A validated batch: slot-copy ops first (relocations, then copies), then
// stores, then restores. Only the planner that compiled it may run it.
struct CompiledBatch {
  uint64_t planner_serial = 0;
  std::vector<OpDesc> ops;
  std::vector<int32_t> unit_ids;
  uint32_t num_pair_ops = 0;
  uint32_t num_paged_ops = 0;
  uint64_t bytes = 0;  // bytes copied (each read once and written once)
};

struct CopySpan {
  uint64_t src = 0;
  uint64_t dst = 0;
  uint64_t bytes = 0;
};

class SpanPlanner {
 public:
  // Template pieces longer than this are cut (a piece's length is 32-bit).
  static constexpr uint64_t kMaxPieceBytes = uint64_t{1} << 30;

  // Throws std::invalid_argument for empty or inconsistent tables.
  SpanPlanner(std::vector<Segment> image_segments, std::vector<Segment> slot_segments,
              std::vector<Segment> unit_segments, int64_t num_slots, int64_t num_units, std::string layout_id);

  uint64_t serial() const { return serial_; }
  int64_t num_slots() const { return num_slots_; }
  int64_t num_units() const { return num_units_; }
  int64_t image_bytes() const { return image_bytes_; }
  int64_t slot_bytes() const { return slot_bytes_; }
  int64_t unit_bytes() const { return unit_bytes_; }
  int64_t units_per_image() const { return units_per_image_; }
  const std::string& layout_id() const { return layout_id_; }
  // The per-layout templates: what one PAGE op / one slot copy moves.
  const std::vector<TemplatePiece>& paged_template() const { return paged_; }
  const std::vector<TemplatePiece>& slot_template() const { return slot_; }

  // Validates every op of the batch first and throws std::invalid_argument
  // (naming the op) or std::out_of_range: layout id, total bytes, unit count,
  // unit and slot ranges, one writer per slot / unit, and no op reading what
  // another op of the batch writes (the ops of one batch run concurrently on
  // a GPU). O(ops + unit ids): conflicts are found with epoch-stamped scratch
  // that is allocated once, never cleared per batch.
  void validate(const MaintenanceBatch& batch) const;
  CompiledBatch compile(const MaintenanceBatch& batch) const;
  // A batch of stores only (or restores only) given as arrays: op i moves
  // slot `slots[i]` to (from) units `unit_ids[i * units_per_image() ...]`.
  // Validated as compile() validates the same ops (names them the same way),
  // without building per-op objects: host moves of many units go this way.
  // (Pointer + count, not std::span: the CUDA sources include this as C++17.)
  CompiledBatch compile_paged(const int64_t* slots, size_t num_slots, const int64_t* unit_ids, size_t num_unit_ids,
                              bool restores) const;
  // memcpy of every piece of every op (host memory the layout describes).
  void run_on_cpu(const CompiledBatch& batch) const;
  // The (src, dst, bytes) spans a batch moves, in order (tests, debugging).
  std::vector<CopySpan> spans(const CompiledBatch& batch) const;
  // Throws std::invalid_argument unless this planner compiled `batch`.
  void check_owner(const CompiledBatch& batch) const;

 private:
  // One stamp per slot and unit (4 bytes each, so a planner over a large
  // host arena stays small); who wrote an id is looked up only on an error.
  struct Scratch {
    std::vector<uint32_t> slot_stamp, unit_stamp;
    uint32_t epoch = 0;
  };

  void check_paged(const PagedCopyOp& op, const char* kind, size_t index) const;
  void validate_locked(const MaintenanceBatch& batch) const;
  uint32_t next_epoch() const;

  std::vector<Segment> image_segments_, slot_segments_, unit_segments_;
  int64_t num_slots_, num_units_;
  std::string layout_id_;
  int64_t image_bytes_ = 0, slot_bytes_ = 0, unit_bytes_ = 0, units_per_image_ = 0;
  std::vector<TemplatePiece> paged_, slot_;
  uint64_t serial_;
  mutable std::mutex scratch_mutex_;
  mutable Scratch scratch_;
};

}  // namespace statecache
