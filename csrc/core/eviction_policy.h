// Which checkpoint a cache spends first: the pluggable cost model shared by
// the PAGE store (its READY images) and the free-list core (checkpointed
// slots and groups).
//
// Two settings:
//  * kLru (the reference behaviour, the default): the host's own LRU list,
//    guesses at its head. This object then holds nothing and costs nothing.
//  * kCost: recency and value together, as Marconi ranks (recency plus
//    weight x prefill FLOPs a hit saves per byte freed, both min-max
//    normalised), in O(1) per operation: checkpoints sit in a few LRU
//    segments, one per octave of position, so each segment's head is its
//    oldest and, within a factor of two, its cheapest; the victim is the
//    lowest-scoring head. Guesses get a segment of their own that is spent
//    first while `guesses_first` holds.
//
// Positions are whatever unit the caller files in (hash blocks here);
// `tokens_per_position` turns them into tokens. A position of 0 means
// unknown and ranks as the cheapest.
//
// The host keeps its own LRU list in both settings (its views and the
// reference's order read it); under kCost this order is kept beside it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/errors.h"

namespace statecache {

struct EvictionCostModel {
  enum class Kind : uint8_t { kLru = 0, kCost = 1 };
  Kind kind = Kind::kLru;
  double flops_per_token = 1.0;          // position-independent FLOPs of one token
  double flops_per_context_token = 0.0;  // attention, per earlier token
  double checkpoint_bytes = 1.0;         // what spending one checkpoint frees
  double tokens_per_position = 1.0;
  double weight = 1.0;  // value against recency
  bool guesses_first = true;
  // KV bytes a resumed prefix holds per position. 0 (the GPU caches: a
  // checkpoint frees its own bytes): value per checkpoint byte. > 0 (a tier
  // that keeps KV blocks and states in one budget): value per byte of the
  // whole prefix, state and KV, so a long prefix is not valued as if its KV
  // were free.
  double kv_bytes_per_position = 0.0;

  // Prefill FLOPs a hit at `position` saves, per byte that keeping it takes.
  double value(int64_t position) const {
    const double n = static_cast<double>(position) * tokens_per_position;
    return (n * flops_per_token + flops_per_context_token * n * (n + 1.0) * 0.5) /
           (checkpoint_bytes + kv_bytes_per_position * static_cast<double>(position));
  }

  // std::invalid_argument naming the field; nothing is applied before.
  void validate() const {
    auto finite_at_least = [](const char* name, double v, double lo, bool strict) {
      if (!std::isfinite(v) || v < lo || (strict && v == lo))
        bad_argument(name, std::to_string(v), strict ? "must be a finite number > 0" : "must be a finite number >= 0");
    };
    finite_at_least("flops_per_token", flops_per_token, 0.0, false);
    finite_at_least("flops_per_context_token", flops_per_context_token, 0.0, false);
    finite_at_least("checkpoint_bytes", checkpoint_bytes, 0.0, true);
    finite_at_least("tokens_per_position", tokens_per_position, 0.0, true);
    finite_at_least("weight", weight, 0.0, false);
    finite_at_least("kv_bytes_per_position", kv_bytes_per_position, 0.0, false);
  }
};

// The kCost order over indices 0..n of the host (slab slots, units). The
// host calls push / remove / replace wherever its own LRU list changes, and
// asks `victim` instead of reading its head.
class CheckpointEvictionOrder {
 public:
  static constexpr int kSegments = 16;        // octaves of position
  static constexpr int kGuesses = kSegments;  // the guess segment's number

  const EvictionCostModel& model() const { return model_; }
  bool active() const { return model_.kind == EvictionCostModel::Kind::kCost; }

  // Takes a validated model. The host rebuilds (clear + push in its LRU
  // order) when `needs_rebuild` says so: segments depend on the kind and on
  // guesses_first only, so weights change in O(1).
  bool needs_rebuild(const EvictionCostModel& m) const {
    return m.kind != model_.kind || m.guesses_first != model_.guesses_first;
  }
  void set_model(const EvictionCostModel& m) { model_ = m; }

  // Validates and installs `m`; when the segments change, re-files every
  // checkpoint: `refile(push)` calls push(idx, is_guess) oldest first.
  template <class Refile>
  void reset_model(const EvictionCostModel& m, Refile&& refile) {
    m.validate();
    const bool rebuild = needs_rebuild(m);
    if (rebuild) clear();
    set_model(m);
    if (rebuild) refile([this](int64_t idx, bool guess) { push(idx, guess); });
  }

  void clear() {
    for (auto& e : entries_) e.seg = -1, e.prev = e.next = -1;
    for (auto& s : segs_) s = Seg{};
  }

  // Where the checkpoint at `idx` resumes. Recorded under kCost only (the
  // reference setting stays free of it); what was filed before a switch to
  // kCost ranks as position 0.
  void set_position(int64_t idx, int64_t position) {
    if (!active()) return;
    grow(idx);
    entries_[static_cast<size_t>(idx)].position = position < 0 ? 0 : position;
  }
  int64_t position(int64_t idx) const {
    return idx >= 0 && static_cast<size_t>(idx) < entries_.size() ? entries_[static_cast<size_t>(idx)].position : 0;
  }

  // Newest in its segment.
  void push(int64_t idx, bool guess) {
    if (!active()) return;
    grow(idx);
    Entry& e = entries_[static_cast<size_t>(idx)];
    if (e.seg >= 0) remove(idx);
    const int s = guess && model_.guesses_first ? kGuesses : segment_of(e.position);
    e.seg = static_cast<int8_t>(s);
    e.tick = ++tick_;
    e.prev = segs_[s].tail;
    e.next = -1;
    if (segs_[s].tail >= 0)
      entries_[static_cast<size_t>(segs_[s].tail)].next = static_cast<int32_t>(idx);
    else
      segs_[s].head = static_cast<int32_t>(idx);
    segs_[s].tail = static_cast<int32_t>(idx);
  }

  void remove(int64_t idx) {
    if (!active() || idx < 0 || static_cast<size_t>(idx) >= entries_.size()) return;
    Entry& e = entries_[static_cast<size_t>(idx)];
    if (e.seg < 0) return;
    Seg& s = segs_[e.seg];
    if (e.prev >= 0)
      entries_[static_cast<size_t>(e.prev)].next = e.next;
    else
      s.head = e.next;
    if (e.next >= 0)
      entries_[static_cast<size_t>(e.next)].prev = e.prev;
    else
      s.tail = e.prev;
    e.prev = e.next = -1;
    e.seg = -1;
  }

  // `to` takes `from`'s place (a re-homed checkpoint: same use, new address).
  void replace(int64_t from, int64_t to) {
    if (!active()) return;
    grow(std::max(from, to));
    Entry& a = entries_[static_cast<size_t>(from)];
    Entry& b = entries_[static_cast<size_t>(to)];
    b = a;
    if (a.seg >= 0) {
      Seg& s = segs_[a.seg];
      if (a.prev >= 0)
        entries_[static_cast<size_t>(a.prev)].next = static_cast<int32_t>(to);
      else
        s.head = static_cast<int32_t>(to);
      if (a.next >= 0)
        entries_[static_cast<size_t>(a.next)].prev = static_cast<int32_t>(to);
      else
        s.tail = static_cast<int32_t>(to);
    }
    a.prev = a.next = -1;
    a.seg = -1;
  }

  bool contains(int64_t idx) const {
    return idx >= 0 && static_cast<size_t>(idx) < entries_.size() && entries_[static_cast<size_t>(idx)].seg >= 0;
  }

  // The index to spend first among those `ok(idx)` accepts, or -1. Walks
  // each segment from its head past refused entries (pinned ones in the
  // store; none in the free list but an excluded index).
  template <class Ok>
  int64_t victim(Ok&& ok) const {
    int64_t head[kSegments + 1];
    for (int s = 0; s <= kSegments; ++s) {
      int64_t i = segs_[s].head;
      while (i >= 0 && !ok(i)) i = entries_[static_cast<size_t>(i)].next;
      head[s] = i;
    }
    if (model_.guesses_first && head[kGuesses] >= 0) return head[kGuesses];
    uint64_t t_lo = std::numeric_limits<uint64_t>::max();
    double v_lo = std::numeric_limits<double>::infinity(), v_hi = -v_lo;
    double value[kSegments + 1];
    for (int s = 0; s <= kSegments; ++s) {
      if (head[s] < 0) continue;
      const Entry& e = entries_[static_cast<size_t>(head[s])];
      value[s] = model_.value(e.position);
      if (e.tick < t_lo) t_lo = e.tick;
      v_lo = std::min(v_lo, value[s]);
      v_hi = std::max(v_hi, value[s]);
    }
    const double t_span = static_cast<double>(tick_ - t_lo) > 0 ? static_cast<double>(tick_ - t_lo) : 1.0;
    const double v_span = v_hi > v_lo ? v_hi - v_lo : 1.0;
    int64_t best = -1;
    double best_score = std::numeric_limits<double>::infinity();
    uint64_t best_tick = 0;
    for (int s = 0; s <= kSegments; ++s) {
      if (head[s] < 0) continue;
      const Entry& e = entries_[static_cast<size_t>(head[s])];
      const double score = static_cast<double>(e.tick - t_lo) / t_span + model_.weight * (value[s] - v_lo) / v_span;
      if (score < best_score || (score == best_score && e.tick < best_tick)) {
        best = head[s];
        best_score = score;
        best_tick = e.tick;
      }
    }
    return best;
  }

  // Members in segment order, each oldest first (tests, debugging).
  std::vector<int64_t> members() const {
    std::vector<int64_t> out;
    for (int s = kSegments; s >= 0; --s)
      for (int32_t i = segs_[s].head; i >= 0; i = entries_[static_cast<size_t>(i)].next) out.push_back(i);
    return out;
  }
  int64_t size() const {
    int64_t n = 0;
    for (const auto& e : entries_) n += e.seg >= 0;
    return n;
  }

 private:
  struct Entry {
    int64_t position = 0;
    uint64_t tick = 0;
    int32_t prev = -1, next = -1;
    int8_t seg = -1;
  };
  struct Seg {
    int32_t head = -1, tail = -1;
  };

  static int segment_of(int64_t position) {
    if (position <= 1) return 0;
    const int s = 63 - __builtin_clzll(static_cast<unsigned long long>(position));
    return s < kSegments - 1 ? s : kSegments - 1;
  }
  void grow(int64_t idx) {
    if (static_cast<size_t>(idx) >= entries_.size()) entries_.resize(static_cast<size_t>(idx) + 1);
  }

  EvictionCostModel model_;
  std::vector<Entry> entries_;
  Seg segs_[kSegments + 1];
  uint64_t tick_ = 0;
};

}  // namespace statecache
