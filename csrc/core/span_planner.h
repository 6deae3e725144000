// Span planner: turns one batch of state maintenance ops into flat
// (src, dst, bytes) copy spans, and runs them on the CPU with memcpy.
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
// computed once per layout (the template); a batch only adds bases.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace statecache {

struct Segment {
  uint64_t base = 0;
  int64_t stride = 0;
  int64_t bytes = 0;
};

struct CopySpan {
  uint64_t src = 0;
  uint64_t dst = 0;
  uint64_t bytes = 0;
};

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

// The maintenance ops of one batch, in the order SPEC §7 issues them.
struct MaintenanceBatch {
  std::vector<SlotCopyOp> relocations;
  std::vector<SlotCopyOp> copies;
  std::vector<PagedCopyOp> stores;
  std::vector<PagedCopyOp> restores;
};

struct CopyPlan {
  std::vector<CopySpan> spans;
  uint64_t bytes = 0;  // bytes copied (each read once and written once)
};

class SpanPlanner {
 public:
  // Spans longer than this are cut so that a GPU descriptor's 32-bit length
  // and chunk counts never overflow.
  static constexpr uint64_t kMaxSpanBytes = uint64_t{1} << 30;

  // Throws std::invalid_argument for empty or inconsistent tables.
  SpanPlanner(std::vector<Segment> image_segments, std::vector<Segment> slot_segments,
              std::vector<Segment> unit_segments, int64_t num_slots, int64_t num_units,
              std::string layout_id);

  int64_t num_slots() const { return num_slots_; }
  int64_t num_units() const { return num_units_; }
  int64_t image_bytes() const { return image_bytes_; }
  int64_t slot_bytes() const { return slot_bytes_; }
  int64_t unit_bytes() const { return unit_bytes_; }
  int64_t units_per_image() const { return units_per_image_; }
  const std::string& layout_id() const { return layout_id_; }
  // Upper bounds on the spans one op adds (merging only lowers them).
  size_t spans_per_paged_op() const { return pieces_.size(); }
  size_t spans_per_slot_copy() const { return slot_pieces_; }

  // Validates every op of the batch first and throws std::invalid_argument
  // (naming the op) or std::out_of_range before planning anything: layout id,
  // total bytes, unit count, unit and slot ranges, one writer per slot / unit,
  // and no op reading what another op of the batch writes (the ops of one
  // batch run concurrently on a GPU).
  void validate(const MaintenanceBatch& batch) const;
  CopyPlan plan(const MaintenanceBatch& batch) const;

 private:
  // One piece of the image <-> units intersection: image segment `image_seg`
  // at `image_off` within its row, unit k of the op, unit segment `unit_seg`
  // at `unit_off` within its row.
  struct Piece {
    uint32_t image_seg;
    uint32_t unit_seg;
    uint32_t unit_k;
    int64_t image_off;
    int64_t unit_off;
    int64_t bytes;
  };

  void check_paged(const PagedCopyOp& op, const char* kind, size_t index) const;
  void add_paged(const PagedCopyOp& op, bool store, CopyPlan& plan) const;
  void add_slot_copy(const SlotCopyOp& op, CopyPlan& plan) const;

  std::vector<Segment> image_segments_, slot_segments_, unit_segments_;
  int64_t num_slots_, num_units_;
  std::string layout_id_;
  int64_t image_bytes_ = 0, slot_bytes_ = 0, unit_bytes_ = 0, units_per_image_ = 0;
  std::vector<Piece> pieces_;
  size_t slot_pieces_ = 0;
};

// Runs a plan's spans with memcpy. The caller guarantees the addresses are
// host memory the plan's layout describes (the planner checked the ranges).
void run_spans_on_cpu(const CopyPlan& plan);

}  // namespace statecache
