// One-launch batched state copies for CUDA and HIP (see copy_kernels.h for
// the contract). The batch is a list of work items, item i of op j being
// template chunk i applied to op j's slot and units; chunks are at most
// kItemBytes, so 16 KiB rows and 384 KiB rows spread over the grid alike.
// Warps take items grid-stride (neighbouring warps, neighbouring items: the
// grid sweeps the batch front to back), and each lane keeps kUnroll 16-byte
// loads in flight before its first store. No block-wide synchronisation.
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

// The runtime header first: span_planner.h's resolve() needs its qualifiers.
#include "kernels/gpu_compat.h"

#include "kernels/copy_kernels.h"

namespace statecache {

namespace {

constexpr int kThreads = 256;
constexpr int kWarp = 32;
constexpr int kUnroll = 6;
constexpr int kNarrowUnroll = 4;       // misaligned sides: fewer registers, still 4 loads in flight
constexpr int kMinBlocksPerSm = 4;     // <= 64 registers: 8 x 16-byte vectors fit
constexpr uint32_t kItemBytes = 4096;  // one or two rounds of a warp

// Head of a staged batch; its ops follow, then its unit ids. A captured graph
// reads the counts from here rather than from its baked launch arguments.
struct BatchHeader {
  uint32_t num_pair_ops;
  uint32_t num_paged_ops;
  uint64_t reserved;
};
static_assert(sizeof(BatchHeader) == 16, "descriptor layout is shared with the host");

void check(gpuError_t err, const char* what) {
  if (err != gpuSuccess)
    throw std::runtime_error(std::string("statecache GPU copy: ") + what + ": " + gpuGetErrorString(err));
}

// Makes `device` current for the scope; restores the caller's device after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check(gpuGetDevice(&saved_), "get device");
    if (saved_ != device) check(gpuSetDevice(device), "set device");
  }
  ~DeviceGuard() { (void)gpuSetDevice(saved_); }

 private:
  int saved_ = 0;
};

// n words split over the warp in rounds of kWarp * kUnroll: every lane issues
// all its loads of a round before its stores.
template <int Unroll, typename Word>
__device__ __forceinline__ void warp_words(Word* __restrict__ dst, const Word* __restrict__ src, uint32_t n,
                                           uint32_t lane) {
  // r: words from this lane's position to the end; immediate offsets u * kWarp.
  const Word* s = src + lane;
  Word* d = dst + lane;
  for (int32_t r = static_cast<int32_t>(n) - static_cast<int32_t>(lane); r > 0;
       r -= kWarp * Unroll, s += kWarp * Unroll, d += kWarp * Unroll) {
    Word v[Unroll];
#pragma unroll
    for (int u = 0; u < Unroll; ++u)
      if (u * kWarp < r) v[u] = gpu_load(s + u * kWarp);
#pragma unroll
    for (int u = 0; u < Unroll; ++u)
      if (u * kWarp < r) gpu_store(d + u * kWarp, v[u]);
  }
}

// Sides that disagree mod 16 (rare: odd offsets in misaligned layouts). Kept
// out of line so the 16-byte path's registers are not sized for all widths.
__device__ __forceinline__ void warp_words_narrow(unsigned char* d, const unsigned char* s, uint32_t words, uint32_t w,
                                                  uint32_t lane) {
  switch (w) {
    case 8:
      warp_words<kNarrowUnroll>(reinterpret_cast<uint2*>(d), reinterpret_cast<const uint2*>(s), words, lane);
      break;
    case 4:
      warp_words<kNarrowUnroll>(reinterpret_cast<uint32_t*>(d), reinterpret_cast<const uint32_t*>(s), words, lane);
      break;
    case 2:
      warp_words<kNarrowUnroll>(reinterpret_cast<uint16_t*>(d), reinterpret_cast<const uint16_t*>(s), words, lane);
      break;
    default:
      warp_words<kNarrowUnroll>(d, s, words, lane);
  }
}

// Warp-wide copy of n bytes: a byte head up to the widest word both sides can
// share, words, then a byte tail (head and tail are shorter than a word).
template <int Unroll>
__device__ __forceinline__ void warp_copy(uint64_t dst_addr, uint64_t src_addr, uint32_t n, uint32_t lane) {
  auto* dst = reinterpret_cast<unsigned char*>(dst_addr);
  const auto* src = reinterpret_cast<const unsigned char*>(src_addr);
  const uint64_t x = src_addr ^ dst_addr;
  const uint32_t w = (x & 15) == 0 ? 16 : (x & 7) == 0 ? 8 : (x & 3) == 0 ? 4 : (x & 1) == 0 ? 2 : 1;
  uint32_t head = static_cast<uint32_t>((w - (src_addr & (w - 1))) & (w - 1));
  if (head > n) head = n;
  const uint32_t words = (n - head) / w;
  const uint32_t tail = head + words * w;
  if (lane < head) dst[lane] = src[lane];
  if (tail + lane < n) dst[tail + lane] = src[tail + lane];
  unsigned char* d = dst + head;
  const unsigned char* s = src + head;
  if (w == 16)
    warp_words<Unroll>(reinterpret_cast<uint4*>(d), reinterpret_cast<const uint4*>(s), words, lane);
  else
    warp_words_narrow(d, s, words, w, lane);
}

// `chunks`: the slot-copy template's `slot_items` chunks, then the paged
// template's `paged_items`. `batch`: header, ops, unit ids (staged per batch).
// Unroll: 16-byte loads in flight per lane; MinBlocks: blocks an SM must
// hold (caps the registers). Both builds are kept so the benchmark can time
// them side by side; variant 0 is the default.
template <int Unroll, int MinBlocks>
__global__ void __launch_bounds__(kThreads, MinBlocks)
    copy_ops_kernel(const TemplatePiece* __restrict__ chunks, uint32_t slot_items, uint32_t paged_items,
                    const unsigned char* __restrict__ batch) {
  const BatchHeader h = *reinterpret_cast<const BatchHeader*>(batch);
  const OpDesc* __restrict__ ops = reinterpret_cast<const OpDesc*>(batch + sizeof(BatchHeader));
  const int32_t* __restrict__ units = reinterpret_cast<const int32_t*>(ops + h.num_pair_ops + h.num_paged_ops);
  const uint64_t pair_items = uint64_t{h.num_pair_ops} * slot_items;
  const uint64_t total = pair_items + uint64_t{h.num_paged_ops} * paged_items;
  const uint32_t lane = threadIdx.x % kWarp;
  const uint64_t warps = uint64_t{gridDim.x} * (kThreads / kWarp);
  // Item -> (op, template chunk): slot copies first, then PAGE ops.
  auto locate = [&](uint64_t item, uint64_t& op, uint64_t& chunk) {
    if (item < pair_items) {
      op = item / slot_items;
      chunk = item - op * slot_items;
    } else {
      const uint64_t i = item - pair_items, j = i / paged_items;
      op = h.num_pair_ops + j;
      chunk = slot_items + (i - j * paged_items);
    }
  };
  for (uint64_t item = uint64_t{blockIdx.x} * (kThreads / kWarp) + threadIdx.x / kWarp; item < total; item += warps) {
    uint64_t op, chunk;
    locate(item, op, chunk);
    const TemplatePiece p = chunks[chunk];
    uint64_t src, dst;
    resolve(p, ops[op], units, src, dst);
    warp_copy<Unroll>(dst, src, p.bytes, lane);
  }
}

// Moves the staged descriptors from mapped pinned host memory to the device,
// 16 bytes a thread: a kernel node rather than a copy-engine memcpy, which
// measured 3-14 us in a graph on an H200 against ~2 us for this.
__global__ void fetch_descriptors_kernel(uint4* __restrict__ dst, const uint4* __restrict__ src, uint32_t n) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = src[i];
}

using KernelFn = void (*)(const TemplatePiece*, uint32_t, uint32_t, const unsigned char*);
// 4 x 16 B in flight, 4 blocks of 256 an SM (64 registers), or 8 x 16 B in
// flight, 2 blocks an SM: the same bytes in flight per SM, timed alike. Tried
// on an H200 and dropped (kernel alone, kv16 layout): fewer warps so that
// every warp gets the same number of items (1 op 29.4 us against 28.3);
// prefetching the next item's descriptors into L1 (16 ops 336.9 us against
// 325.4, 1 op 28.7 against 28.2); 2 KiB items (16 ops 327.9 against 324.8);
// loading the first item's descriptors along with the header (no gain).
constexpr KernelFn kVariants[] = {copy_ops_kernel<4, 4>, copy_ops_kernel<8, 2>};
constexpr int kNumVariants = sizeof(kVariants) / sizeof(kVariants[0]);

bool capturing(gpuStream_t stream) {
  gpuStreamCaptureStatus status;
  check(gpuStreamIsCapturing(stream, &status), "query stream capture");
  return status != gpuStreamCaptureStatusNone;
}

// A template cut into work items of at most kItemBytes. Cuts keep each
// side's offset, so their alignment (what picks the word width) is kept too.
void append_items(const std::vector<TemplatePiece>& pieces, std::vector<TemplatePiece>& out) {
  for (const TemplatePiece& p : pieces)
    for (uint32_t off = 0; off < p.bytes; off += kItemBytes) {
      TemplatePiece c = p;
      c.slot_base += off;
      c.other_base += off;
      c.bytes = std::min(kItemBytes, p.bytes - off);
      out.push_back(c);
    }
}

}  // namespace

struct GpuCopyEngine::Impl {
  int device = 0;
  int sms = 0;
  int grid = 0;
  KernelFn kernel = nullptr;
  uint64_t planner_serial = 0;
  size_t max_pairs = 0, max_paged = 0, max_units = 0, capacity_bytes = 0;
  uint32_t slot_items = 0, paged_items = 0;
  TemplatePiece* chunks = nullptr;
  std::vector<unsigned char*> host;
  std::vector<unsigned char*> host_mapped;  // the same staging, as the device addresses it
  std::vector<unsigned char*> dev;
  std::vector<gpuEvent_t> consumed;
  std::vector<bool> pending;
  int current = -1;
  size_t staged_bytes = 0;

  ~Impl() {  // never throws: it also runs when the constructor failed
    int saved = -1;
    if (gpuGetDevice(&saved) != gpuSuccess) return;
    if (saved != device) (void)gpuSetDevice(device);
    for (size_t b = 0; b < host.size(); ++b) {
      if (pending[b]) (void)gpuEventSynchronize(consumed[b]);
      if (consumed[b]) (void)gpuEventDestroy(consumed[b]);
      if (dev[b]) (void)gpuFree(dev[b]);
      if (host[b]) (void)gpuFreeHost(host[b]);
    }
    if (chunks) (void)gpuFree(chunks);
    if (saved != device) (void)gpuSetDevice(saved);
  }
};

GpuCopyEngine::GpuCopyEngine(int device, const SpanPlanner& planner, size_t max_pair_ops, size_t max_paged_ops,
                             int buffers, int variant)
    : impl_(std::make_unique<Impl>()) {
  if (variant < 0 || variant >= kNumVariants)
    throw std::invalid_argument("variant=" + std::to_string(variant) + ": must be in [0, " +
                                std::to_string(kNumVariants) + ")");
  if (buffers < 1) throw std::invalid_argument("buffers=" + std::to_string(buffers) + ": must be >= 1");
  if (max_pair_ops + max_paged_ops < 1 || max_pair_ops + max_paged_ops >= (size_t{1} << 30))
    throw std::invalid_argument("max_pair_ops + max_paged_ops must be in [1, 2**30)");
  Impl& m = *impl_;
  m.device = device;
  m.kernel = kVariants[variant];
  m.planner_serial = planner.serial();
  m.max_pairs = max_pair_ops;
  m.max_paged = max_paged_ops;
  m.max_units = max_paged_ops * static_cast<size_t>(planner.units_per_image());
  m.capacity_bytes =
      sizeof(BatchHeader) + (max_pair_ops + max_paged_ops) * sizeof(OpDesc) + m.max_units * sizeof(int32_t);
  m.capacity_bytes = (m.capacity_bytes + 15) / 16 * 16;  // fetched in 16-byte words
  std::vector<TemplatePiece> items;
  append_items(planner.slot_template(), items);
  m.slot_items = static_cast<uint32_t>(items.size());
  append_items(planner.paged_template(), items);
  if (items.size() >= UINT32_MAX) throw std::invalid_argument("the layout's templates are too large");
  m.paged_items = static_cast<uint32_t>(items.size()) - m.slot_items;
  DeviceGuard guard(device);
  check(gpuDeviceGetAttribute(&m.sms, gpuDevAttrMultiProcessorCount, device), "read SM count");
  int per_sm = 0;
  check(gpuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, m.kernel, kThreads, 0), "read occupancy");
  m.grid = m.sms * std::max(1, per_sm);
  check(gpuMalloc(reinterpret_cast<void**>(&m.chunks), items.size() * sizeof(TemplatePiece)),
        "allocate the layout's templates");
  check(gpuMemcpy(m.chunks, items.data(), items.size() * sizeof(TemplatePiece), gpuMemcpyHostToDevice),
        "upload the layout's templates");
  m.host.assign(buffers, nullptr);
  m.host_mapped.assign(buffers, nullptr);
  m.dev.assign(buffers, nullptr);
  m.consumed.assign(buffers, nullptr);
  m.pending.assign(buffers, false);
  for (int b = 0; b < buffers; ++b) {
    check(
        gpuHostAlloc(reinterpret_cast<void**>(&m.host[b]), m.capacity_bytes, gpuHostAllocMapped | gpuHostAllocPortable),
        "allocate pinned staging");
    check(gpuHostGetDevicePointer(reinterpret_cast<void**>(&m.host_mapped[b]), m.host[b], 0), "map pinned staging");
    check(gpuMalloc(reinterpret_cast<void**>(&m.dev[b]), m.capacity_bytes), "allocate descriptors");
    check(gpuEventCreateWithFlags(&m.consumed[b], gpuEventDisableTiming), "create event");
    // An empty batch until the first stage: a replay before it moves nothing.
    *reinterpret_cast<BatchHeader*>(m.host[b]) = {0, 0, 0};
    check(gpuMemcpy(m.dev[b], m.host[b], sizeof(BatchHeader), gpuMemcpyHostToDevice), "clear descriptors");
  }
}

GpuCopyEngine::~GpuCopyEngine() = default;

void GpuCopyEngine::stage(const CompiledBatch& batch) {
  Impl& m = *impl_;
  if (batch.planner_serial != m.planner_serial)
    throw std::invalid_argument("the batch was compiled for another layout");
  if (batch.num_pair_ops > m.max_pairs || batch.num_paged_ops > m.max_paged || batch.unit_ids.size() > m.max_units)
    throw std::invalid_argument("the batch has " + std::to_string(batch.num_pair_ops) + " slot copies and " +
                                std::to_string(batch.num_paged_ops) + " PAGE ops, the staging holds " +
                                std::to_string(m.max_pairs) + " and " + std::to_string(m.max_paged));
  const int b = (m.current + 1) % static_cast<int>(m.host.size());
  if (m.pending[b]) {
    check(gpuEventSynchronize(m.consumed[b]), "wait for staging");
    m.pending[b] = false;
  }
  unsigned char* out = m.host[b];
  *reinterpret_cast<BatchHeader*>(out) = {batch.num_pair_ops, batch.num_paged_ops, 0};
  size_t off = sizeof(BatchHeader);
  std::memcpy(out + off, batch.ops.data(), batch.ops.size() * sizeof(OpDesc));
  off += batch.ops.size() * sizeof(OpDesc);
  std::memcpy(out + off, batch.unit_ids.data(), batch.unit_ids.size() * sizeof(int32_t));
  off += batch.unit_ids.size() * sizeof(int32_t);
  m.current = b;
  m.staged_bytes = off;
}

void GpuCopyEngine::launch(uintptr_t stream_handle, bool full_transfer, bool copy_descriptors) {
  Impl& m = *impl_;
  if (m.current < 0 && !full_transfer) throw std::logic_error("launch before stage");
  if (m.current < 0) m.current = 0, m.staged_bytes = sizeof(BatchHeader);  // the empty batch
  auto stream = reinterpret_cast<gpuStream_t>(stream_handle);
  DeviceGuard guard(m.device);
  if (copy_descriptors) {
    const uint32_t words = static_cast<uint32_t>(((full_transfer ? m.capacity_bytes : m.staged_bytes) + 15) / 16);
    fetch_descriptors_kernel<<<(words + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
        reinterpret_cast<uint4*>(m.dev[m.current]), reinterpret_cast<const uint4*>(m.host_mapped[m.current]), words);
    check(gpuGetLastError(), "launch descriptor fetch");
  }
  m.kernel<<<m.grid, kThreads, 0, stream>>>(m.chunks, m.slot_items, m.paged_items, m.dev[m.current]);
  check(gpuGetLastError(), "launch copy kernel");
  if (!capturing(stream)) {
    check(gpuEventRecord(m.consumed[m.current], stream), "record event");
    m.pending[m.current] = true;
  }
}

void GpuCopyEngine::record_consumed(uintptr_t stream_handle) {
  Impl& m = *impl_;
  if (m.current < 0) return;
  auto stream = reinterpret_cast<gpuStream_t>(stream_handle);
  DeviceGuard guard(m.device);
  check(gpuEventRecord(m.consumed[m.current], stream), "record event");
  m.pending[m.current] = true;
}

int GpuCopyEngine::device() const { return impl_->device; }
int GpuCopyEngine::num_sms() const { return impl_->sms; }
int GpuCopyEngine::grid_blocks() const { return impl_->grid; }
size_t GpuCopyEngine::max_pair_ops() const { return impl_->max_pairs; }
size_t GpuCopyEngine::max_paged_ops() const { return impl_->max_paged; }
size_t GpuCopyEngine::staging_bytes() const { return impl_->capacity_bytes; }
uint32_t GpuCopyEngine::items_per_paged_op() const { return impl_->paged_items; }
uint32_t GpuCopyEngine::items_per_slot_copy() const { return impl_->slot_items; }
size_t GpuCopyEngine::item_bytes() { return kItemBytes; }
int GpuCopyEngine::num_variants() { return kNumVariants; }

}  // namespace statecache
