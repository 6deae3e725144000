#include "core/span_planner.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "core/errors.h"

namespace statecache {

namespace {

[[noreturn]] void bad_op(const std::string& op, const std::string& why) {
  throw std::invalid_argument(op + ": " + why);
}

std::string paged_name(const char* kind, size_t index, const PagedCopyOp& op) {
  const bool store = std::strcmp(kind, "stores") == 0;
  return std::string(kind) + "[" + std::to_string(index) + "] (" +
         (store ? "src_slot=" : "dst_slot=") + std::to_string(op.slot) + ")";
}

std::string pair_name(const char* kind, size_t index, const SlotCopyOp& op) {
  return std::string(kind) + "[" + std::to_string(index) + "] (src=" + std::to_string(op.src) +
         ", dst=" + std::to_string(op.dst) + ")";
}

void check_table(const std::vector<Segment>& table, const char* name, int64_t count) {
  if (table.empty()) bad_argument(name, 0LL, "needs at least one segment");
  for (const Segment& s : table) {
    if (s.bytes <= 0) bad_argument(name, static_cast<long long>(s.bytes), "segment bytes must be > 0");
    // Rows of one segment must not overlap, or a copy into one item would
    // clobber its neighbour.
    if (count > 1 && s.stride < s.bytes)
      bad_argument(name, static_cast<long long>(s.stride), "stride is smaller than the row it steps over");
  }
}

int64_t total(const std::vector<Segment>& table) {
  int64_t n = 0;
  for (const Segment& s : table) n += s.bytes;
  return n;
}

uint64_t address(const Segment& s, int64_t index, int64_t offset) {
  return s.base + static_cast<uint64_t>(index) * static_cast<uint64_t>(s.stride) +
         static_cast<uint64_t>(offset);
}

// Appends a span, merging it into the previous one when both sides continue
// it (neighbouring units of one tensor, say).
void push_span(CopyPlan& plan, uint64_t src, uint64_t dst, uint64_t bytes) {
  plan.bytes += bytes;
  if (!plan.spans.empty()) {
    CopySpan& last = plan.spans.back();
    if (last.src + last.bytes == src && last.dst + last.bytes == dst &&
        last.bytes + bytes <= SpanPlanner::kMaxSpanBytes) {
      last.bytes += bytes;
      return;
    }
  }
  plan.spans.push_back({src, dst, bytes});
}

// An id (slot or unit) and the op that touches it, for the conflict checks;
// the op is named only when a check fails.
enum class OpKind : uint8_t { kRelocation, kCopy, kStore, kRestore };

struct Touch {
  int64_t id;
  OpKind kind;
  uint32_t index;
};

std::string op_name(const MaintenanceBatch& b, const Touch& t) {
  switch (t.kind) {
    case OpKind::kRelocation:
      return pair_name("relocations", t.index, b.relocations[t.index]);
    case OpKind::kCopy:
      return pair_name("copies", t.index, b.copies[t.index]);
    case OpKind::kStore:
      return paged_name("stores", t.index, b.stores[t.index]);
    default:
      return paged_name("restores", t.index, b.restores[t.index]);
  }
}

// One writer per id, and no id both read and written: a table indexed by id
// holding the writing touch (linear in the batch, no sorting).
void check_conflicts(const std::vector<Touch>& reads, const std::vector<Touch>& writes, int64_t count,
                     const char* what, const MaintenanceBatch& b) {
  std::vector<int32_t> writer(static_cast<size_t>(count), -1);
  for (size_t i = 0; i < writes.size(); ++i) {
    int32_t& w = writer[static_cast<size_t>(writes[i].id)];
    if (w >= 0)
      bad_op(op_name(b, writes[i]), std::string("writes ") + what + " " + std::to_string(writes[i].id) +
                                        ", which " + op_name(b, writes[w]) + " also writes");
    w = static_cast<int32_t>(i);
  }
  for (const Touch& r : reads) {
    const int32_t w = writer[static_cast<size_t>(r.id)];
    if (w >= 0)
      bad_op(op_name(b, r), std::string("reads ") + what + " " + std::to_string(r.id) + ", which " +
                                op_name(b, writes[w]) + " writes in the same batch (its ops run concurrently)");
  }
}

}  // namespace

SpanPlanner::SpanPlanner(std::vector<Segment> image_segments, std::vector<Segment> slot_segments,
                         std::vector<Segment> unit_segments, int64_t num_slots, int64_t num_units,
                         std::string layout_id)
    : image_segments_(std::move(image_segments)),
      slot_segments_(std::move(slot_segments)),
      unit_segments_(std::move(unit_segments)),
      num_slots_(num_slots),
      num_units_(num_units),
      layout_id_(std::move(layout_id)) {
  if (num_slots_ <= 0) bad_argument("num_slots", static_cast<long long>(num_slots_), "must be > 0");
  if (num_units_ <= 0) bad_argument("num_units", static_cast<long long>(num_units_), "must be > 0");
  if (layout_id_.empty()) bad_argument("layout_id", layout_id_, "must not be empty");
  check_table(image_segments_, "image_segments", num_slots_);
  check_table(slot_segments_, "slot_segments", num_slots_);
  check_table(unit_segments_, "unit_segments", num_units_);
  image_bytes_ = total(image_segments_);
  slot_bytes_ = total(slot_segments_);
  unit_bytes_ = total(unit_segments_);
  if (image_bytes_ > slot_bytes_)
    bad_argument("image_segments", static_cast<long long>(image_bytes_),
                 "the image holds more bytes than a slot");
  units_per_image_ = (image_bytes_ + unit_bytes_ - 1) / unit_bytes_;

  // Walk the image and the unit stream side by side; every change of segment
  // on either side starts a new piece.
  size_t is = 0, us = 0;
  int64_t ioff = 0, uoff = 0;
  uint32_t k = 0;
  while (is < image_segments_.size()) {
    int64_t n = std::min(image_segments_[is].bytes - ioff, unit_segments_[us].bytes - uoff);
    n = std::min<int64_t>(n, static_cast<int64_t>(kMaxSpanBytes));
    pieces_.push_back({static_cast<uint32_t>(is), static_cast<uint32_t>(us), k, ioff, uoff, n});
    ioff += n;
    uoff += n;
    if (ioff == image_segments_[is].bytes) ++is, ioff = 0;
    if (uoff == unit_segments_[us].bytes) {
      uoff = 0;
      if (++us == unit_segments_.size()) us = 0, ++k;
    }
  }
  for (const Segment& s : slot_segments_)
    slot_pieces_ += static_cast<size_t>((static_cast<uint64_t>(s.bytes) + kMaxSpanBytes - 1) / kMaxSpanBytes);
}

void SpanPlanner::check_paged(const PagedCopyOp& op, const char* kind, size_t index) const {
  auto name = [&] { return paged_name(kind, index, op); };
  if (op.layout_id != layout_id_)
    bad_op(name(), "layout_id '" + op.layout_id + "' is not this executor's layout '" + layout_id_ + "'");
  if (op.total_bytes != image_bytes_)
    bad_op(name(), "total_bytes=" + std::to_string(op.total_bytes) + " but the image holds " +
                     std::to_string(image_bytes_) + " bytes");
  if (op.slot < 0 || op.slot >= num_slots_)
    bad_op(name(), "slot " + std::to_string(op.slot) + " is out of range [0, " +
                     std::to_string(num_slots_) + ")");
  if (static_cast<int64_t>(op.unit_ids.size()) != units_per_image_)
    bad_op(name(), "has " + std::to_string(op.unit_ids.size()) + " unit_ids, the image needs " +
                     std::to_string(units_per_image_));
  for (size_t i = 0; i < op.unit_ids.size(); ++i)
    if (op.unit_ids[i] < 0 || op.unit_ids[i] >= num_units_)
      bad_op(name(), "unit_ids[" + std::to_string(i) + "]=" + std::to_string(op.unit_ids[i]) +
                       " is out of range [0, " + std::to_string(num_units_) + ")");
}

void SpanPlanner::validate(const MaintenanceBatch& batch) const {
  std::vector<Touch> slot_reads, slot_writes, unit_reads, unit_writes;
  auto pairs = [&](const std::vector<SlotCopyOp>& ops, const char* kind, OpKind k) {
    for (size_t i = 0; i < ops.size(); ++i) {
      const SlotCopyOp& op = ops[i];
      for (int64_t s : {op.src, op.dst})
        if (s < 0 || s >= num_slots_)
          bad_op(pair_name(kind, i, op), "slot " + std::to_string(s) + " is out of range [0, " +
                                             std::to_string(num_slots_) + ")");
      if (op.src == op.dst) bad_op(pair_name(kind, i, op), "copies a slot onto itself");
      slot_reads.push_back({op.src, k, static_cast<uint32_t>(i)});
      slot_writes.push_back({op.dst, k, static_cast<uint32_t>(i)});
    }
  };
  pairs(batch.relocations, "relocations", OpKind::kRelocation);
  pairs(batch.copies, "copies", OpKind::kCopy);
  unit_writes.reserve(batch.stores.size() * static_cast<size_t>(units_per_image_));
  unit_reads.reserve(batch.restores.size() * static_cast<size_t>(units_per_image_));
  for (size_t i = 0; i < batch.stores.size(); ++i) {
    const PagedCopyOp& op = batch.stores[i];
    check_paged(op, "stores", i);
    slot_reads.push_back({op.slot, OpKind::kStore, static_cast<uint32_t>(i)});
    for (int64_t u : op.unit_ids) unit_writes.push_back({u, OpKind::kStore, static_cast<uint32_t>(i)});
  }
  for (size_t i = 0; i < batch.restores.size(); ++i) {
    const PagedCopyOp& op = batch.restores[i];
    check_paged(op, "restores", i);
    slot_writes.push_back({op.slot, OpKind::kRestore, static_cast<uint32_t>(i)});
    for (int64_t u : op.unit_ids) unit_reads.push_back({u, OpKind::kRestore, static_cast<uint32_t>(i)});
  }
  check_conflicts(slot_reads, slot_writes, num_slots_, "slot", batch);
  check_conflicts(unit_reads, unit_writes, num_units_, "unit", batch);
}

void SpanPlanner::add_paged(const PagedCopyOp& op, bool store, CopyPlan& plan) const {
  for (const Piece& p : pieces_) {
    uint64_t slot_side = address(image_segments_[p.image_seg], op.slot, p.image_off);
    uint64_t unit_side = address(unit_segments_[p.unit_seg], op.unit_ids[p.unit_k], p.unit_off);
    uint64_t n = static_cast<uint64_t>(p.bytes);
    if (store)
      push_span(plan, slot_side, unit_side, n);
    else
      push_span(plan, unit_side, slot_side, n);
  }
}

void SpanPlanner::add_slot_copy(const SlotCopyOp& op, CopyPlan& plan) const {
  for (const Segment& s : slot_segments_)
    for (int64_t off = 0; off < s.bytes; off += static_cast<int64_t>(kMaxSpanBytes)) {
      uint64_t n = std::min<uint64_t>(kMaxSpanBytes, static_cast<uint64_t>(s.bytes - off));
      push_span(plan, address(s, op.src, off), address(s, op.dst, off), n);
    }
}

CopyPlan SpanPlanner::plan(const MaintenanceBatch& batch) const {
  validate(batch);
  CopyPlan plan;
  plan.spans.reserve((batch.relocations.size() + batch.copies.size()) * slot_pieces_ +
                     (batch.stores.size() + batch.restores.size()) * pieces_.size());
  for (const SlotCopyOp& op : batch.relocations) add_slot_copy(op, plan);
  for (const SlotCopyOp& op : batch.copies) add_slot_copy(op, plan);
  for (const PagedCopyOp& op : batch.stores) add_paged(op, true, plan);
  for (const PagedCopyOp& op : batch.restores) add_paged(op, false, plan);
  return plan;
}

void run_spans_on_cpu(const CopyPlan& plan) {
  for (const CopySpan& s : plan.spans)
    std::memcpy(reinterpret_cast<void*>(static_cast<uintptr_t>(s.dst)),
                reinterpret_cast<const void*>(static_cast<uintptr_t>(s.src)), s.bytes);
}

}  // namespace statecache
