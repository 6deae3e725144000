#include "core/host_arena.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <string_view>
#include <unordered_set>

#include "core/errors.h"

namespace statecache {

HostArena::HostArena(int64_t entry_bytes, int64_t capacity_bytes, std::vector<int64_t> class_budget_bytes,
                     const EvictionCostModel& model)
    : entry_bytes_(entry_bytes), num_entries_(0), model_(model) {
  model.validate();
  if (entry_bytes <= 0) bad_argument("entry_bytes", entry_bytes, "must be > 0");
  if (capacity_bytes < 0) bad_argument("capacity_bytes", capacity_bytes, "must be >= 0");
  if (class_budget_bytes.empty()) bad_argument("class_budget_bytes", 0, "needs at least one class");
  num_entries_ = capacity_bytes / entry_bytes;
  if (num_entries_ > INT32_MAX) bad_argument("capacity_bytes", capacity_bytes, "holds more than 2^31 entries");
  int64_t total = 0;
  for (int64_t b : class_budget_bytes) {
    if (b < 0 && b != kShared) bad_argument("class_budget_bytes", b, "must be >= 0 (or shared)");
    ClassStats c;
    c.budget_entries = b == kShared ? num_entries_ : b / entry_bytes;
    // Checked per class, so the sum stays below 2 * INT32_MAX entries.
    if (b != kShared && (c.budget_entries > num_entries_ || (total += c.budget_entries) > num_entries_))
      bad_argument("class_budget_bytes", b, "takes the caps past the arena's capacity_bytes");
    classes_.push_back(c);
    capped_.push_back(b != kShared);
  }
  free_.resize(static_cast<size_t>(num_entries_));
  // Lowest entry ids first: pop_back hands out free_.back().
  std::iota(free_.rbegin(), free_.rend(), 0);
  ranked_.resize(classes_.size());
  ranked_all_.set_model(order_model(model_));
  for (auto& r : ranked_) r.set_model(order_model(model_));
}

// The arena keeps no list of its own: 'lru' is the cost order with the
// value left out (each segment's head is its oldest, so the oldest head wins).
EvictionCostModel HostArena::order_model(const EvictionCostModel& m) const {
  EvictionCostModel o = m;
  o.kv_bytes_per_position = kv_bytes_per_position_;
  if (m.kind == EvictionCostModel::Kind::kLru) o.weight = 0;
  o.kind = EvictionCostModel::Kind::kCost;
  o.guesses_first = false;
  return o;
}

void HostArena::set_eviction_model(const EvictionCostModel& model) {
  model.validate();
  model_ = model;
  // Segments depend on neither weights nor kind here (no guesses): the
  // order stays, only the scoring changes.
  ranked_all_.set_model(order_model(model_));
  for (auto& r : ranked_) r.set_model(order_model(model_));
}

void HostArena::set_kv_bytes_per_position(double bytes) {
  if (!std::isfinite(bytes) || bytes < 0)
    bad_argument("kv_bytes_per_position", std::to_string(bytes), "must be a finite number >= 0");
  kv_bytes_per_position_ = bytes;
  set_eviction_model(model_);
}

bool HostArena::capped(int klass) const {
  check_class(klass);
  return capped_[static_cast<size_t>(klass)];
}

void HostArena::check_class(int klass) const { check_index("klass", klass, static_cast<long long>(classes_.size())); }

const HostArena::ClassStats& HostArena::class_stats(int klass) const {
  check_class(klass);
  return classes_[static_cast<size_t>(klass)];
}

const HostArena::Slot* HostArena::find(const std::string& key) const {
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : &slab_[static_cast<size_t>(it->second)];
}

HostArena::Slot* HostArena::find(const std::string& key) {
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : &slab_[static_cast<size_t>(it->second)];
}

// Newest in its class's order (a use).
void HostArena::rank(int32_t idx) {
  Slot& s = slab_[static_cast<size_t>(idx)];
  if (!rankable(s)) return;
  for (auto* order : {&ranked_all_, &ranked_[static_cast<size_t>(s.v.klass)]}) {
    order->set_position(idx, s.v.position);
    order->push(idx, false);
  }
}

void HostArena::unrank(int32_t idx) {
  ranked_all_.remove(idx);
  ranked_[static_cast<size_t>(slab_[static_cast<size_t>(idx)].v.klass)].remove(idx);
}

std::optional<std::vector<std::string>> HostArena::victims(int klass, int64_t count) const {
  check_class(klass);
  if (count < 0) bad_argument("count", count, "must be >= 0");
  const ClassStats& c = classes_[static_cast<size_t>(klass)];
  // More than the class's cap (or the arena) never fits, and the sums below
  // cannot overflow.
  if (count > c.budget_entries) return std::nullopt;
  // Room under the class's cap comes only from the class; room in the arena
  // from whatever ranks lowest.
  int64_t need_class = capped_[static_cast<size_t>(klass)] ? c.used_entries + count - c.budget_entries : 0;
  int64_t need_arena = count - static_cast<int64_t>(free_.size());
  std::vector<std::string> out;
  std::vector<int64_t> planned;
  auto unplanned = [&](int64_t i) { return std::find(planned.begin(), planned.end(), i) == planned.end(); };
  while (need_class > 0 || need_arena > 0) {
    const auto& order = need_class > 0 ? ranked_[static_cast<size_t>(klass)] : ranked_all_;
    const int64_t idx = order.victim(unplanned);
    if (idx < 0) return std::nullopt;
    planned.push_back(idx);
    const Slot& s = slab_[static_cast<size_t>(idx)];
    out.push_back(s.key);
    const auto n = static_cast<int64_t>(s.v.entries.size());
    need_arena -= n;
    if (s.v.klass == klass) need_class -= n;
  }
  return out;
}

std::optional<std::vector<int32_t>> HostArena::allocate(const std::string& key, int klass, int64_t count,
                                                        int64_t nbytes, int64_t position,
                                                        std::vector<std::string>* evicted) {
  check_class(klass);
  if (count <= 0) bad_argument("count", count, "must be > 0");
  int64_t room = 0;  // count * entry_bytes; past INT64_MAX no nbytes exceeds it
  const bool huge = __builtin_mul_overflow(count, entry_bytes_, &room);
  if (nbytes < 0 || (!huge && nbytes > room)) bad_argument("nbytes", nbytes, "must be in [0, count * entry_bytes]");
  if (position < 0) bad_argument("position", position, "must be >= 0");
  if (index_.count(key) != 0) bad_argument("key", key, "is already in the arena");
  ClassStats& c = classes_[static_cast<size_t>(klass)];
  auto plan = victims(klass, count);
  if (!plan) {
    ++c.refused;
    return std::nullopt;
  }
  for (const std::string& victim : *plan) {
    const int32_t idx = index_.at(victim);
    ++c.evictions;
    ++generation_;
    if (evicted != nullptr) evicted->push_back(victim);
    unrank(idx);
    release(idx);
  }
  check_invariant(static_cast<int64_t>(free_.size()) >= count, "host arena: victims freed too few entries");
  int32_t idx;
  if (!free_slots_.empty()) {
    idx = free_slots_.back();
    free_slots_.pop_back();
  } else {
    idx = static_cast<int32_t>(slab_.size());
    slab_.emplace_back();
  }
  Slot& s = slab_[static_cast<size_t>(idx)];
  s = Slot{};
  s.key = key;
  s.live = true;
  s.v.klass = klass;
  s.v.nbytes = nbytes;
  s.v.position = position;
  s.v.entries.resize(static_cast<size_t>(count));
  for (auto& e : s.v.entries) {
    e = free_.back();
    free_.pop_back();
  }
  c.used_entries += count;
  ++c.values;
  index_.emplace(key, idx);
  return s.v.entries;
}

void HostArena::seal(const std::string& key, std::string meta) {
  Slot* s = find(key);
  if (s == nullptr || s->doomed) bad_argument("key", key, "was not allocated");
  if (s->sealed) bad_argument("key", key, "is already sealed");
  s->sealed = true;
  ++generation_;
  s->v.meta = std::move(meta);
  rank(index_.at(key));
}

std::vector<std::optional<std::vector<int32_t>>> HostArena::allocate_many(const std::vector<std::string>& keys,
                                                                          int klass, const std::vector<int64_t>& counts,
                                                                          const std::vector<int64_t>& nbytes,
                                                                          const std::vector<int64_t>& positions,
                                                                          std::vector<std::string>* evicted) {
  check_class(klass);
  const size_t n = keys.size();
  if (counts.size() != n) bad_argument("counts", static_cast<int64_t>(counts.size()), "must have one count per key");
  if (nbytes.size() != n) bad_argument("nbytes", static_cast<int64_t>(nbytes.size()), "must have one nbytes per key");
  if (positions.size() != n)
    bad_argument("positions", static_cast<int64_t>(positions.size()), "must have one position per key");
  for (size_t i = 0; i < n; ++i) {  // allocate()'s checks, before anything changes
    if (counts[i] <= 0) bad_argument("counts", counts[i], "must be > 0");
    int64_t room = 0;
    const bool huge = __builtin_mul_overflow(counts[i], entry_bytes_, &room);
    if (nbytes[i] < 0 || (!huge && nbytes[i] > room))
      bad_argument("nbytes", nbytes[i], "must be in [0, count * entry_bytes]");
    if (positions[i] < 0) bad_argument("positions", positions[i], "must be >= 0");
  }
  std::vector<std::optional<std::vector<int32_t>>> out(n);
  for (size_t i = 0; i < n; ++i)
    if (index_.count(keys[i]) == 0) out[i] = allocate(keys[i], klass, counts[i], nbytes[i], positions[i], evicted);
  return out;
}

void HostArena::seal_many(const std::vector<std::string>& keys, std::vector<std::string> metas) {
  if (metas.size() != keys.size())
    bad_argument("metas", static_cast<int64_t>(metas.size()), "must have one meta per key");
  std::unordered_set<std::string_view> seen;
  for (const std::string& key : keys) {
    const Slot* s = find(key);
    if (s == nullptr || s->doomed) bad_argument("key", key, "was not allocated");
    if (s->sealed || !seen.insert(key).second) bad_argument("key", key, "is already sealed");
  }
  for (size_t i = 0; i < keys.size(); ++i) seal(keys[i], std::move(metas[i]));
}

bool HostArena::refile(const std::string& key, int64_t position) {
  if (position < 0) bad_argument("position", position, "must be >= 0");
  Slot* s = find(key);
  if (s == nullptr || !s->sealed || s->doomed) return false;
  const int32_t idx = index_.at(key);
  unrank(idx);
  s->v.position = position;
  rank(idx);  // a no-op while pinned: unpin ranks it at the new position
  return true;
}

void HostArena::release(int32_t idx) {
  Slot& s = slab_[static_cast<size_t>(idx)];
  ClassStats& c = classes_[static_cast<size_t>(s.v.klass)];
  c.used_entries -= static_cast<int64_t>(s.v.entries.size());
  --c.values;
  // Freed entries go to the back so the next allocation reuses warm pages.
  free_.insert(free_.end(), s.v.entries.rbegin(), s.v.entries.rend());
  index_.erase(s.key);
  s = Slot{};
  free_slots_.push_back(idx);
}

bool HostArena::remove(const std::string& key) {
  auto it = index_.find(key);
  if (it == index_.end() || slab_[static_cast<size_t>(it->second)].doomed) return false;
  const int32_t idx = it->second;
  Slot& s = slab_[static_cast<size_t>(idx)];
  ++generation_;
  unrank(idx);
  if (s.pins > 0) {
    s.doomed = true;
    return true;
  }
  release(idx);
  return true;
}

bool HostArena::contains(const std::string& key) const {
  const Slot* s = find(key);
  return s != nullptr && s->sealed && !s->doomed;
}

std::vector<bool> HostArena::contains_many(const std::vector<std::string>& keys, bool touch) {
  std::vector<bool> out(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) out[i] = touch ? lookup(keys[i], true) != nullptr : contains(keys[i]);
  return out;
}

int64_t HostArena::refile_many(const std::vector<std::string>& keys, const std::vector<int64_t>& positions) {
  if (positions.size() != keys.size())
    bad_argument("positions", static_cast<int64_t>(positions.size()), "must have one position per key");
  for (int64_t p : positions)
    if (p < 0) bad_argument("positions", p, "must be >= 0");
  int64_t n = 0;
  for (size_t i = 0; i < keys.size(); ++i) n += refile(keys[i], positions[i]);
  return n;
}

const HostArena::Value* HostArena::lookup(const std::string& key, bool touch) {
  Slot* s = find(key);
  if (s == nullptr || !s->sealed || s->doomed) return nullptr;
  if (touch) {
    const int32_t idx = index_.at(key);
    unrank(idx);
    rank(idx);
  }
  return &s->v;
}

void HostArena::pin(const std::string& key) {
  Slot* s = find(key);
  if (s == nullptr || !s->sealed || s->doomed) bad_argument("key", key, "is not a sealed value");
  const int32_t idx = index_.at(key);
  unrank(idx);
  ++s->pins;
}

void HostArena::unpin(const std::string& key) {
  Slot* s = find(key);
  if (s == nullptr || s->pins <= 0) bad_argument("key", key, "is not pinned");
  const int32_t idx = index_.at(key);
  if (--s->pins > 0) return;
  if (s->doomed) {
    release(idx);
    return;
  }
  rank(idx);
}

int64_t HostArena::pins(const std::string& key) const {
  const Slot* s = find(key);
  return s == nullptr ? 0 : s->pins;
}

std::vector<std::string> HostArena::keys() const {
  std::vector<std::string> out;
  for (const auto& [key, idx] : index_) {
    const Slot& s = slab_[static_cast<size_t>(idx)];
    if (s.sealed && !s.doomed) out.push_back(key);
  }
  return out;
}

void HostArena::check_consistency() const {
  std::vector<char> seen(static_cast<size_t>(num_entries_), 0);
  for (int32_t e : free_) {
    check_invariant(e >= 0 && e < num_entries_ && !seen[static_cast<size_t>(e)], "host arena: bad free entry");
    seen[static_cast<size_t>(e)] = 1;
  }
  std::vector<int64_t> used(classes_.size(), 0);
  std::vector<size_t> ranked(classes_.size(), 0);
  size_t ranked_all = 0;
  for (const auto& [key, idx] : index_) {
    const Slot& s = slab_[static_cast<size_t>(idx)];
    check_invariant(s.live && s.key == key, "host arena: index names a dead slot");
    for (int32_t e : s.v.entries) {
      check_invariant(e >= 0 && e < num_entries_ && !seen[static_cast<size_t>(e)], "host arena: entry held twice");
      seen[static_cast<size_t>(e)] = 1;
    }
    used[static_cast<size_t>(s.v.klass)] += static_cast<int64_t>(s.v.entries.size());
    check_invariant(ranked_[static_cast<size_t>(s.v.klass)].contains(idx) == rankable(s) &&
                        ranked_all_.contains(idx) == rankable(s),
                    "host arena: ranked set and rankable values disagree");
    ranked[static_cast<size_t>(s.v.klass)] += rankable(s);
    ranked_all += rankable(s);
  }
  check_invariant(static_cast<int64_t>(ranked_all) == ranked_all_.size(), "host arena: ranking holds stale values");
  for (size_t c = 0; c < classes_.size(); ++c) {
    check_invariant(used[c] == classes_[c].used_entries, "host arena: class usage drifted");
    check_invariant(used[c] <= classes_[c].budget_entries, "host arena: class over budget");
    check_invariant(static_cast<int64_t>(ranked[c]) == ranked_[c].size(), "host arena: ranking holds stale values");
  }
  for (char s : seen) check_invariant(s != 0, "host arena: entry lost");
}

}  // namespace statecache
