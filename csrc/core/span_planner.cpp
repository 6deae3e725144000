#include "core/span_planner.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
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
  return std::string(kind) + "[" + std::to_string(index) + "] (" + (store ? "src_slot=" : "dst_slot=") +
         std::to_string(op.slot) + ")";
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

// Appends a piece, merging it into the previous one when it continues it on
// both sides for every slot and unit (equal strides, adjacent bases): rows
// adjacent in source and destination become one longer piece.
void push_piece(std::vector<TemplatePiece>& out, const TemplatePiece& p) {
  if (!out.empty()) {
    TemplatePiece& last = out.back();
    if (last.unit_k == p.unit_k && last.slot_stride == p.slot_stride && last.other_stride == p.other_stride &&
        last.slot_base + last.bytes == p.slot_base && last.other_base + last.bytes == p.other_base &&
        uint64_t{last.bytes} + p.bytes <= SpanPlanner::kMaxPieceBytes) {
      last.bytes += p.bytes;
      return;
    }
  }
  out.push_back(p);
}

// Who touches an id, for the conflict checks: the op kind in the top two
// bits, its index below; the op is named only when a check fails.
enum OpKind : uint32_t { kRelocation = 0, kCopy = 1, kStore = 2, kRestore = 3 };
constexpr uint32_t kIndexBits = 30;
constexpr uint32_t kMaxOps = uint32_t{1} << kIndexBits;

uint32_t touch(OpKind kind, size_t index) { return (uint32_t{kind} << kIndexBits) | static_cast<uint32_t>(index); }

std::string op_name(const MaintenanceBatch& b, uint32_t t) {
  const size_t i = t & (kMaxOps - 1);
  switch (t >> kIndexBits) {
    case kRelocation:
      return pair_name("relocations", i, b.relocations[i]);
    case kCopy:
      return pair_name("copies", i, b.copies[i]);
    case kStore:
      return paged_name("stores", i, b.stores[i]);
    default:
      return paged_name("restores", i, b.restores[i]);
  }
}

std::atomic<uint64_t> next_serial{1};

}  // namespace

SpanPlanner::SpanPlanner(std::vector<Segment> image_segments, std::vector<Segment> slot_segments,
                         std::vector<Segment> unit_segments, int64_t num_slots, int64_t num_units,
                         std::string layout_id)
    : image_segments_(std::move(image_segments)),
      slot_segments_(std::move(slot_segments)),
      unit_segments_(std::move(unit_segments)),
      num_slots_(num_slots),
      num_units_(num_units),
      layout_id_(std::move(layout_id)),
      serial_(next_serial.fetch_add(1)) {
  if (num_slots_ <= 0) bad_argument("num_slots", static_cast<long long>(num_slots_), "must be > 0");
  if (num_units_ <= 0 || num_units_ > std::numeric_limits<int32_t>::max())
    bad_argument("num_units", static_cast<long long>(num_units_), "must be in [1, 2**31)");
  if (layout_id_.empty()) bad_argument("layout_id", layout_id_, "must not be empty");
  check_table(image_segments_, "image_segments", num_slots_);
  check_table(slot_segments_, "slot_segments", num_slots_);
  check_table(unit_segments_, "unit_segments", num_units_);
  image_bytes_ = total(image_segments_);
  slot_bytes_ = total(slot_segments_);
  unit_bytes_ = total(unit_segments_);
  if (image_bytes_ > slot_bytes_)
    bad_argument("image_segments", static_cast<long long>(image_bytes_), "the image holds more bytes than a slot");
  units_per_image_ = (image_bytes_ + unit_bytes_ - 1) / unit_bytes_;
  if (units_per_image_ >= kMaxOps)
    bad_argument("unit_segments", static_cast<long long>(unit_bytes_), "units are too small for the image");

  // Walk the image and the unit stream side by side; every change of segment
  // on either side starts a new piece.
  size_t is = 0, us = 0;
  int64_t ioff = 0, uoff = 0;
  int32_t k = 0;
  while (is < image_segments_.size()) {
    const Segment& img = image_segments_[is];
    const Segment& unit = unit_segments_[us];
    int64_t n = std::min(img.bytes - ioff, unit.bytes - uoff);
    n = std::min<int64_t>(n, static_cast<int64_t>(kMaxPieceBytes));
    push_piece(paged_, {img.base + static_cast<uint64_t>(ioff), unit.base + static_cast<uint64_t>(uoff), img.stride,
                        unit.stride, static_cast<uint32_t>(n), k});
    ioff += n;
    uoff += n;
    if (ioff == img.bytes) ++is, ioff = 0;
    if (uoff == unit.bytes) {
      uoff = 0;
      if (++us == unit_segments_.size()) us = 0, ++k;
    }
  }
  for (const Segment& s : slot_segments_)
    for (int64_t off = 0; off < s.bytes; off += static_cast<int64_t>(kMaxPieceBytes)) {
      const uint64_t n = std::min<uint64_t>(kMaxPieceBytes, static_cast<uint64_t>(s.bytes - off));
      const uint64_t base = s.base + static_cast<uint64_t>(off);
      push_piece(slot_, {base, base, s.stride, s.stride, static_cast<uint32_t>(n), -1});
    }
}

void SpanPlanner::check_paged(const PagedCopyOp& op, const char* kind, size_t index) const {
  auto name = [&] { return paged_name(kind, index, op); };
  if (op.layout_id != layout_id_)
    bad_op(name(), "layout_id '" + op.layout_id + "' is not this executor's layout '" + layout_id_ + "'");
  if (op.total_bytes != image_bytes_)
    bad_op(name(), "total_bytes=" + std::to_string(op.total_bytes) + " but the image holds " +
                       std::to_string(image_bytes_) + " bytes");
  if (op.slot < 0 || op.slot >= num_slots_)
    bad_op(name(), "slot " + std::to_string(op.slot) + " is out of range [0, " + std::to_string(num_slots_) + ")");
  if (static_cast<int64_t>(op.unit_ids.size()) != units_per_image_)
    bad_op(name(), "has " + std::to_string(op.unit_ids.size()) + " unit_ids, the image needs " +
                       std::to_string(units_per_image_));
  for (size_t i = 0; i < op.unit_ids.size(); ++i)
    if (op.unit_ids[i] < 0 || op.unit_ids[i] >= num_units_)
      bad_op(name(), "unit_ids[" + std::to_string(i) + "]=" + std::to_string(op.unit_ids[i]) + " is out of range [0, " +
                         std::to_string(num_units_) + ")");
}

void SpanPlanner::validate(const MaintenanceBatch& batch) const {
  const size_t n = batch.relocations.size() + batch.copies.size() + batch.stores.size() + batch.restores.size();
  if (n >= kMaxOps) bad_argument("batch", static_cast<long long>(n), "holds too many ops");
  auto pairs = [&](const std::vector<SlotCopyOp>& ops, const char* kind) {
    for (size_t i = 0; i < ops.size(); ++i) {
      const SlotCopyOp& op = ops[i];
      for (int64_t s : {op.src, op.dst})
        if (s < 0 || s >= num_slots_)
          bad_op(pair_name(kind, i, op),
                 "slot " + std::to_string(s) + " is out of range [0, " + std::to_string(num_slots_) + ")");
      if (op.src == op.dst) bad_op(pair_name(kind, i, op), "copies a slot onto itself");
    }
  };
  pairs(batch.relocations, "relocations");
  pairs(batch.copies, "copies");
  for (size_t i = 0; i < batch.stores.size(); ++i) check_paged(batch.stores[i], "stores", i);
  for (size_t i = 0; i < batch.restores.size(); ++i) check_paged(batch.restores[i], "restores", i);
  // The scratch is shared by every batch of this planner (and every executor
  // of its layout): one batch at a time.
  std::lock_guard<std::mutex> lock(scratch_mutex_);
  validate_locked(batch);
}

uint32_t SpanPlanner::next_epoch() const {
  Scratch& s = scratch_;
  if (s.slot_stamp.empty()) {
    s.slot_stamp.assign(static_cast<size_t>(num_slots_), 0);
    s.unit_stamp.assign(static_cast<size_t>(num_units_), 0);
  }
  if (++s.epoch == 0) {  // wrapped: old stamps could match again
    std::fill(s.slot_stamp.begin(), s.slot_stamp.end(), 0);
    std::fill(s.unit_stamp.begin(), s.unit_stamp.end(), 0);
    s.epoch = 1;
  }
  return s.epoch;
}

namespace {

// The first op of `b` (in the order validation stamps writes) that writes
// slot or unit `id`; only asked once a check has failed.
uint32_t first_writer(const MaintenanceBatch& b, bool unit, int64_t id) {
  if (unit) {
    for (size_t i = 0; i < b.stores.size(); ++i)
      for (int64_t u : b.stores[i].unit_ids)
        if (u == id) return touch(kStore, i);
  } else {
    for (size_t i = 0; i < b.relocations.size(); ++i)
      if (b.relocations[i].dst == id) return touch(kRelocation, i);
    for (size_t i = 0; i < b.copies.size(); ++i)
      if (b.copies[i].dst == id) return touch(kCopy, i);
    for (size_t i = 0; i < b.restores.size(); ++i)
      if (b.restores[i].slot == id) return touch(kRestore, i);
  }
  throw InvariantError("span planner: a stamped id has no writer");
}

}  // namespace

void SpanPlanner::validate_locked(const MaintenanceBatch& b) const {
  Scratch& s = scratch_;
  const uint32_t epoch = next_epoch();
  // One writer per id: the first write stamps it, a second one fails.
  auto write = [&](std::vector<uint32_t>& stamp, bool unit, int64_t id, uint32_t who, const char* what) {
    const size_t i = static_cast<size_t>(id);
    if (stamp[i] == epoch)
      bad_op(op_name(b, who), std::string("writes ") + what + " " + std::to_string(id) + ", which " +
                                  op_name(b, first_writer(b, unit, id)) + " also writes");
    stamp[i] = epoch;
  };
  // No id read by one op and written by another (they run concurrently).
  auto read = [&](const std::vector<uint32_t>& stamp, bool unit, int64_t id, uint32_t who, const char* what) {
    const size_t i = static_cast<size_t>(id);
    if (stamp[i] == epoch)
      bad_op(op_name(b, who), std::string("reads ") + what + " " + std::to_string(id) + ", which " +
                                  op_name(b, first_writer(b, unit, id)) +
                                  " writes in the same batch (its ops run concurrently)");
  };
  for (size_t i = 0; i < b.relocations.size(); ++i)
    write(s.slot_stamp, false, b.relocations[i].dst, touch(kRelocation, i), "slot");
  for (size_t i = 0; i < b.copies.size(); ++i) write(s.slot_stamp, false, b.copies[i].dst, touch(kCopy, i), "slot");
  for (size_t i = 0; i < b.restores.size(); ++i)
    write(s.slot_stamp, false, b.restores[i].slot, touch(kRestore, i), "slot");
  for (size_t i = 0; i < b.stores.size(); ++i)
    for (int64_t u : b.stores[i].unit_ids) write(s.unit_stamp, true, u, touch(kStore, i), "unit");
  for (size_t i = 0; i < b.relocations.size(); ++i)
    read(s.slot_stamp, false, b.relocations[i].src, touch(kRelocation, i), "slot");
  for (size_t i = 0; i < b.copies.size(); ++i) read(s.slot_stamp, false, b.copies[i].src, touch(kCopy, i), "slot");
  for (size_t i = 0; i < b.stores.size(); ++i) read(s.slot_stamp, false, b.stores[i].slot, touch(kStore, i), "slot");
  for (size_t i = 0; i < b.restores.size(); ++i)
    for (int64_t u : b.restores[i].unit_ids) read(s.unit_stamp, true, u, touch(kRestore, i), "unit");
}

CompiledBatch SpanPlanner::compile_paged(const int64_t* slots, size_t n, const int64_t* unit_ids, size_t num_unit_ids,
                                         bool restores) const {
  const char* kind = restores ? "restores" : "stores";
  const size_t k = static_cast<size_t>(units_per_image_);
  if (n >= kMaxOps) bad_argument("batch", static_cast<long long>(n), "holds too many ops");
  if (num_unit_ids != n * k)
    bad_argument("unit_ids", static_cast<long long>(num_unit_ids),
                 "must hold units_per_image ids for each slot, in order");
  // Named as compile() names the same op, so both paths report alike.
  auto name = [&](size_t i) {
    PagedCopyOp op;
    op.slot = slots[i];
    return paged_name(kind, i, op);
  };
  for (size_t i = 0; i < n; ++i) {
    if (slots[i] < 0 || slots[i] >= num_slots_)
      bad_op(name(i), "slot " + std::to_string(slots[i]) + " is out of range [0, " + std::to_string(num_slots_) + ")");
    for (size_t j = 0; j < k; ++j) {
      const int64_t u = unit_ids[i * k + j];
      if (u < 0 || u >= num_units_)
        bad_op(name(i), "unit_ids[" + std::to_string(j) + "]=" + std::to_string(u) + " is out of range [0, " +
                            std::to_string(num_units_) + ")");
    }
  }
  {
    std::lock_guard<std::mutex> lock(scratch_mutex_);
    const uint32_t epoch = next_epoch();
    // Restores write slots, stores write units; what either reads lies on
    // the other side, so one writer per id is the whole check.
    std::vector<uint32_t>& stamp = restores ? scratch_.slot_stamp : scratch_.unit_stamp;
    for (size_t i = 0; i < n; ++i)
      for (size_t j = 0; j < (restores ? 1 : k); ++j) {
        const int64_t id = restores ? slots[i] : unit_ids[i * k + j];
        const size_t at = static_cast<size_t>(id);
        if (stamp[at] == epoch) {
          auto writes = [&](size_t op) {
            if (restores) return slots[op] == id;
            const int64_t* first = unit_ids + op * k;
            return std::find(first, first + k, id) != first + k;
          };
          size_t first = 0;
          while (!writes(first)) ++first;
          bad_op(name(i), std::string("writes ") + (restores ? "slot " : "unit ") + std::to_string(id) + ", which " +
                              name(first) + " also writes");
        }
        stamp[at] = epoch;
      }
  }
  CompiledBatch out;
  out.planner_serial = serial_;
  out.ops.resize(n);
  out.unit_ids.resize(n * k);
  for (size_t i = 0; i < n; ++i) out.ops[i] = {slots[i], static_cast<int64_t>(i * k), restores ? 1u : 0u, 1};
  for (size_t i = 0; i < n * k; ++i) out.unit_ids[i] = static_cast<int32_t>(unit_ids[i]);
  out.num_paged_ops = static_cast<uint32_t>(n);
  out.bytes = n * static_cast<uint64_t>(image_bytes_);
  return out;
}

CompiledBatch SpanPlanner::compile(const MaintenanceBatch& batch) const {
  validate(batch);
  CompiledBatch out;
  out.planner_serial = serial_;
  const size_t pairs = batch.relocations.size() + batch.copies.size();
  const size_t paged = batch.stores.size() + batch.restores.size();
  out.ops.reserve(pairs + paged);
  out.unit_ids.reserve(paged * static_cast<size_t>(units_per_image_));
  for (const auto* list : {&batch.relocations, &batch.copies})
    for (const SlotCopyOp& op : *list) out.ops.push_back({op.src, op.dst, 0, 0});
  for (const auto* list : {&batch.stores, &batch.restores})
    for (const PagedCopyOp& op : *list) {
      out.ops.push_back({op.slot, static_cast<int64_t>(out.unit_ids.size()), list == &batch.restores, 1});
      for (int64_t u : op.unit_ids) out.unit_ids.push_back(static_cast<int32_t>(u));
    }
  out.num_pair_ops = static_cast<uint32_t>(pairs);
  out.num_paged_ops = static_cast<uint32_t>(paged);
  out.bytes = pairs * static_cast<uint64_t>(slot_bytes_) + paged * static_cast<uint64_t>(image_bytes_);
  return out;
}

void SpanPlanner::check_owner(const CompiledBatch& batch) const {
  if (batch.planner_serial != serial_) throw std::invalid_argument("the batch was compiled for another layout");
}

void SpanPlanner::run_on_cpu(const CompiledBatch& batch) const {
  check_owner(batch);
  for (const OpDesc& op : batch.ops)
    for (const TemplatePiece& p : op.paged ? paged_ : slot_) {
      uint64_t src, dst;
      resolve(p, op, batch.unit_ids.data(), src, dst);
      // memmove: layouts over aliasing tensors must not be undefined behaviour.
      std::memmove(reinterpret_cast<void*>(static_cast<uintptr_t>(dst)),
                   reinterpret_cast<const void*>(static_cast<uintptr_t>(src)), p.bytes);
    }
}

std::vector<CopySpan> SpanPlanner::spans(const CompiledBatch& batch) const {
  check_owner(batch);
  std::vector<CopySpan> out;
  for (const OpDesc& op : batch.ops)
    for (const TemplatePiece& p : op.paged ? paged_ : slot_) {
      uint64_t src, dst;
      resolve(p, op, batch.unit_ids.data(), src, dst);
      out.push_back({src, dst, p.bytes});
    }
  return out;
}

}  // namespace statecache
