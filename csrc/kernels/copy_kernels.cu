// One-launch batched state copies for CUDA and HIP (see copy_kernels.h for
// the contract). The batch is a list of work items, item i of op j being
// template chunk i applied to op j's slot and units; chunks are at most
// kItemBytes, so 16 KiB rows and 384 KiB rows spread over the grid alike.
// Warps take items grid-stride (neighbouring warps, neighbouring items: the
// grid sweeps the batch front to back), and each lane keeps kUnroll 16-byte
// loads in flight before its first store. No block-wide synchronisation
// (the inline build syncs once, after copying its parameters to shared memory).
// Host moves run the same kernel on a few large blocks, or go as DMA.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

// The runtime header first: span_planner.h's resolve() needs its qualifiers.
#include "kernels/gpu_compat.h"

#include "kernels/copy_kernels.h"

namespace statecache {

namespace {

constexpr int kThreads = 256;
constexpr int kHostThreads = 1024;  // host moves: one block an SM, so the grid is the SM cap
constexpr int kWarp = 32;
constexpr int kNarrowUnroll = 4;       // misaligned sides: fewer registers, still 4 loads in flight
constexpr uint32_t kItemBytes = 4096;  // one or two rounds of a warp
// A batch of at most this many bytes rides in the kernel's parameters (4 KiB
// with the other arguments: every CUDA and HIP target takes that much); one
// of at most kSmallInlineWords in a build with 1 KiB of them (a shorter launch).
constexpr uint32_t kInlineWords = 250;
constexpr uint32_t kSmallInlineWords = 62;
constexpr size_t kInlineBytes = kInlineWords * 16;
// The SM path of an offload launches its work in slices of about this long,
// so a kernel that needs every SM (a persistent GEMM) running beside it
// waits at most one slice for the SMs the copy holds (H200: a 1 GB offload
// of 4 KiB rows in one launch held 2 SMs for 20 ms and stretched 8 bf16
// GEMMs beside it 1.71x; in 50 us slices, 1.03x, for ~5% of its rate). A
// load goes in one launch: what is queued after it on the current stream
// waits for it anyway, and a PCIe read refilling per slice costs ~10%.
constexpr double kSliceSeconds = 50e-6;
constexpr uint64_t kOneLaunch = ~uint64_t{0} >> 1;
// Runs per cudaMemcpyBatchAsync call. (H200, 4096 scattered 64 KiB runs:
// all in one call 38 GB/s, 1024 a call 48, 256 a call 52, one memcpy a run 17.)
constexpr size_t kDmaBatch = 256;
constexpr uint64_t kAllItems = ~uint64_t{0};

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
// template's `paged_items`. `batch`: header, ops, unit ids (staged per batch,
// or the inline build's shared-memory copy of its parameters).
// Items [item_begin, item_end) of the batch (kAllItems: to its end).
template <int Unroll, int Threads>
__device__ __forceinline__ void copy_batch(const TemplatePiece* __restrict__ chunks, uint32_t slot_items,
                                           uint32_t paged_items, const unsigned char* __restrict__ batch,
                                           uint64_t item_begin, uint64_t item_end) {
  const BatchHeader h = *reinterpret_cast<const BatchHeader*>(batch);
  const OpDesc* __restrict__ ops = reinterpret_cast<const OpDesc*>(batch + sizeof(BatchHeader));
  const int32_t* __restrict__ units = reinterpret_cast<const int32_t*>(ops + h.num_pair_ops + h.num_paged_ops);
  const uint64_t pair_items = uint64_t{h.num_pair_ops} * slot_items;
  const uint64_t all = pair_items + uint64_t{h.num_paged_ops} * paged_items;
  const uint64_t total = item_end < all ? item_end : all;
  const uint32_t lane = threadIdx.x % kWarp;
  const uint64_t warps = uint64_t{gridDim.x} * (Threads / kWarp);
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
  for (uint64_t item = item_begin + uint64_t{blockIdx.x} * (Threads / kWarp) + threadIdx.x / kWarp; item < total;
       item += warps) {
    uint64_t op, chunk;
    locate(item, op, chunk);
    const TemplatePiece p = chunks[chunk];
    uint64_t src, dst;
    resolve(p, ops[op], units, src, dst);
    warp_copy<Unroll>(dst, src, p.bytes, lane);
  }
}

// Unroll: 16-byte loads in flight per lane; MinBlocks: blocks an SM must
// hold (caps the registers). The device builds are kept so the benchmark can
// time them side by side; variant 0 is the default.
template <int Unroll, int MinBlocks, int Threads>
__global__ void __launch_bounds__(Threads, MinBlocks)
    copy_ops_kernel(const TemplatePiece* __restrict__ chunks, uint32_t slot_items, uint32_t paged_items,
                    const unsigned char* __restrict__ batch, uint64_t item_begin, uint64_t item_end) {
  copy_batch<Unroll, Threads>(chunks, slot_items, paged_items, batch, item_begin, item_end);
}

// A small batch passed by value: no staging, no descriptor fetch, one launch.
// Each block copies it to shared memory once, so the items read it there.
template <uint32_t Words>
struct InlineBatch {
  uint4 words[Words];
};

template <int Unroll, int MinBlocks, int Threads, uint32_t Words>
__global__ void __launch_bounds__(Threads, MinBlocks)
    copy_inline_kernel(const TemplatePiece* __restrict__ chunks, uint32_t slot_items, uint32_t paged_items,
                       uint32_t words, uint64_t item_begin, uint64_t item_end,
                       const SC_GRID_CONSTANT InlineBatch<Words> b) {
  extern __shared__ uint4 staged[];
  for (uint32_t i = threadIdx.x; i < words; i += Threads) staged[i] = b.words[i];
  __syncthreads();
  copy_batch<Unroll, Threads>(chunks, slot_items, paged_items, reinterpret_cast<const unsigned char*>(staged),
                              item_begin, item_end);
}

// Moves the staged descriptors from mapped pinned host memory to the device,
// 16 bytes a thread: a kernel node rather than a copy-engine memcpy, which
// measured 3-14 us in a graph on an H200 against ~2 us for this.
__global__ void fetch_descriptors_kernel(uint4* __restrict__ dst, const uint4* __restrict__ src, uint32_t n) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = src[i];
}

using KernelFn = void (*)(const TemplatePiece*, uint32_t, uint32_t, const unsigned char*, uint64_t, uint64_t);
template <uint32_t Words>
using InlineFn = void (*)(const TemplatePiece*, uint32_t, uint32_t, uint32_t, uint64_t, uint64_t, InlineBatch<Words>);
struct KernelBuild {
  KernelFn staged;
  InlineFn<kSmallInlineWords> inline_small;
  InlineFn<kInlineWords> inline_large;
  int threads;
};
template <int Unroll, int MinBlocks, int Threads>
constexpr KernelBuild build_of() {
  return {copy_ops_kernel<Unroll, MinBlocks, Threads>,
          copy_inline_kernel<Unroll, MinBlocks, Threads, kSmallInlineWords>,
          copy_inline_kernel<Unroll, MinBlocks, Threads, kInlineWords>, Threads};
}

// 4 x 16 B in flight, 4 blocks of 256 an SM (64 registers), or 8 x 16 B in
// flight, 2 blocks an SM: the same bytes in flight per SM, timed alike. Tried
// on an H200 and dropped (kernel alone, kv16 layout): fewer warps so that
// every warp gets the same number of items (1 op 29.4 us against 28.3);
// prefetching the next item's descriptors into L1 (16 ops 336.9 us against
// 325.4, 1 op 28.7 against 28.2); 2 KiB items (16 ops 327.9 against 324.8);
// loading the first item's descriptors along with the header (no gain).
constexpr KernelBuild kVariants[] = {build_of<4, 4, kThreads>(), build_of<8, 2, kThreads>()};
constexpr int kNumVariants = sizeof(kVariants) / sizeof(kVariants[0]);
// Host moves: 1024 threads, one block an SM, 64 KiB of loads in flight a
// block (enough to cover a PCIe round trip with a few blocks).
constexpr KernelBuild kHostBuild = build_of<4, 1, kHostThreads>();

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
  KernelBuild build{};
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
  // Host moves.
  bool host_moves = false;
  int host_blocks[2] = {0, 0};  // 0 until read from the profile (or set)
  int staged_direction = 0;
  std::vector<TemplatePiece> paged_pieces;  // the planner's paged template (DMA spans)
  uint64_t run_bytes = 0;                   // mean template piece of a PAGE op (vs the DMA crossover)
  uint64_t run_item_bytes = 0;              // mean work item of a PAGE op (sizes SM slices)
  const HostLinkProfile* link = nullptr;
  std::vector<void*> dma_dst, dma_src;
  std::vector<size_t> dma_bytes;
  bool batch_refused = false;    // the runtime refused a batched memcpy once: runs one by one
  size_t dma_batch = kDmaBatch;  // runs per batched-memcpy call (0: one memcpy per run)
  InlineBatch<kInlineWords> inline_batch{};
  uint64_t slice_bytes = 0;  // host SM path: bytes per launch (0 until measured or set)
  uint64_t staged_items = 0;

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

  void check_batch(const CompiledBatch& batch) const {
    if (batch.planner_serial != planner_serial)
      throw std::invalid_argument("the batch was compiled for another layout");
    if (batch.num_pair_ops > max_pairs || batch.num_paged_ops > max_paged || batch.unit_ids.size() > max_units)
      throw std::invalid_argument("the batch has " + std::to_string(batch.num_pair_ops) + " slot copies and " +
                                  std::to_string(batch.num_paged_ops) + " PAGE ops, the staging holds " +
                                  std::to_string(max_pairs) + " and " + std::to_string(max_paged));
  }

  // 0: device -> host (stores), 1: host -> device (restores).
  int direction(const CompiledBatch& batch) const {
    if (batch.num_pair_ops) throw std::invalid_argument("a host-move batch holds no slot copies");
    int dir = -1;
    for (const OpDesc& op : batch.ops) {
      const int d = op.to_slot ? 1 : 0;
      if (dir >= 0 && d != dir) throw std::invalid_argument("a host-move batch moves one way: stores or restores");
      dir = d;
    }
    return dir < 0 ? 0 : dir;
  }

  int blocks_for(int dir) {
    if (host_blocks[dir] == 0) {
      if (!link) link = &host_link_profile(device);
      host_blocks[0] = host_blocks[0] ? host_blocks[0] : link->blocks[0];
      host_blocks[1] = host_blocks[1] ? host_blocks[1] : link->blocks[1];
    }
    return host_blocks[dir];
  }

  // Items per launch: all of them for device copies; for the host SM path
  // about kSliceSeconds of work at the measured rate.
  uint64_t slice_items(int dir) {
    if (!host_moves) return kAllItems;
    uint64_t bytes = slice_bytes;
    if (bytes == 0) {
      if (!link) link = &host_link_profile(device);
      bytes = link->slice_bytes[dir];
    }
    const uint64_t per_item = std::max<uint64_t>(1, run_item_bytes);
    return std::max<uint64_t>(1, bytes / per_item);
  }

  uint64_t items_of(const CompiledBatch& batch) const {
    return uint64_t{batch.num_pair_ops} * slot_items + uint64_t{batch.num_paged_ops} * paged_items;
  }

  static size_t batch_bytes(const CompiledBatch& batch) {
    return sizeof(BatchHeader) + batch.ops.size() * sizeof(OpDesc) + batch.unit_ids.size() * sizeof(int32_t);
  }

  // The copy kernel over `items` items, in launches of `slice` items.
  void enqueue_copy(gpuStream_t stream, int blocks, const unsigned char* descriptors, uint64_t items, uint64_t slice) {
    if (slice == kAllItems) {
      build.staged<<<blocks, build.threads, 0, stream>>>(chunks, slot_items, paged_items, descriptors, 0, kAllItems);
      check(gpuGetLastError(), "launch copy kernel");
      return;
    }
    for (uint64_t b = 0; b < items; b += slice) {
      build.staged<<<blocks, build.threads, 0, stream>>>(chunks, slot_items, paged_items, descriptors, b, b + slice);
      check(gpuGetLastError(), "launch copy kernel");
    }
  }

  // The batch in the kernel's parameters (the caller checked it fits): the
  // 1 KiB build when it is that small, else the 4 KiB one.
  void launch_inline(const CompiledBatch& batch, gpuStream_t stream, int blocks, uint64_t slice) {
    auto* out = reinterpret_cast<unsigned char*>(inline_batch.words);
    *reinterpret_cast<BatchHeader*>(out) = {batch.num_pair_ops, batch.num_paged_ops, 0};
    size_t off = sizeof(BatchHeader);
    std::memcpy(out + off, batch.ops.data(), batch.ops.size() * sizeof(OpDesc));
    off += batch.ops.size() * sizeof(OpDesc);
    std::memcpy(out + off, batch.unit_ids.data(), batch.unit_ids.size() * sizeof(int32_t));
    off += batch.unit_ids.size() * sizeof(int32_t);
    const uint32_t words = static_cast<uint32_t>((off + 15) / 16);
    const uint64_t items = items_of(batch);
    InlineBatch<kSmallInlineWords> small;
    if (words <= kSmallInlineWords) std::memcpy(small.words, inline_batch.words, words * sizeof(uint4));
    for (uint64_t b = 0; b < items; b += slice) {
      const uint64_t e = slice == kAllItems ? kAllItems : b + slice;
      if (words <= kSmallInlineWords)
        build.inline_small<<<blocks, build.threads, words * sizeof(uint4), stream>>>(chunks, slot_items, paged_items,
                                                                                     words, b, e, small);
      else
        build.inline_large<<<blocks, build.threads, words * sizeof(uint4), stream>>>(chunks, slot_items, paged_items,
                                                                                     words, b, e, inline_batch);
      check(gpuGetLastError(), "launch copy kernel");
      if (slice == kAllItems) break;
    }
  }

  // One DMA per contiguous run (runs that continue each other on both sides
  // merge), batched where the runtime can.
  void dma(const CompiledBatch& batch, gpuStream_t stream) {
    dma_dst.clear();
    dma_src.clear();
    dma_bytes.clear();
    for (const OpDesc& op : batch.ops)
      for (const TemplatePiece& p : paged_pieces) {
        uint64_t src, dst;
        resolve(p, op, batch.unit_ids.data(), src, dst);
        if (!dma_bytes.empty() && reinterpret_cast<uint64_t>(dma_src.back()) + dma_bytes.back() == src &&
            reinterpret_cast<uint64_t>(dma_dst.back()) + dma_bytes.back() == dst) {
          dma_bytes.back() += p.bytes;
          continue;
        }
        dma_src.push_back(reinterpret_cast<void*>(static_cast<uintptr_t>(src)));
        dma_dst.push_back(reinterpret_cast<void*>(static_cast<uintptr_t>(dst)));
        dma_bytes.push_back(p.bytes);
      }
    if (dma_bytes.empty()) return;
    size_t done = 0;
#ifdef SC_HAVE_MEMCPY_BATCH
    if (dma_bytes.size() > 1 && dma_batch > 0 && !batch_refused && !capturing(stream)) {
      cudaMemcpyAttributes attr{};
      attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
      for (; done < dma_bytes.size(); done += dma_batch) {
        const size_t n = std::min(dma_batch, dma_bytes.size() - done);
        size_t first = 0;
#if CUDART_VERSION >= 13000
        const cudaError_t err =
            cudaMemcpyBatchAsync(dma_dst.data() + done, const_cast<const void* const*>(dma_src.data() + done),
                                 dma_bytes.data() + done, n, &attr, &first, 1, stream);
#else
        size_t failed = 0;
        const cudaError_t err = cudaMemcpyBatchAsync(dma_dst.data() + done, dma_src.data() + done,
                                                     dma_bytes.data() + done, n, &attr, &first, 1, &failed, stream);
#endif
        if (err != cudaSuccess) {
          // Refused as a batch (a platform without it): the runs from here
          // go one by one (rewriting what a partial batch wrote is harmless).
          (void)cudaGetLastError();
          batch_refused = true;
          break;
        }
      }
    }
#endif
    for (size_t i = done; i < dma_bytes.size(); ++i)
      check(gpuMemcpyAsync(dma_dst[i], dma_src[i], dma_bytes[i], gpuMemcpyDefault, stream), "enqueue a host copy");
  }
};

GpuCopyEngine::GpuCopyEngine(int device, const SpanPlanner& planner, size_t max_pair_ops, size_t max_paged_ops,
                             int buffers, int variant, bool host_moves)
    : impl_(std::make_unique<Impl>()) {
  if (variant < 0 || variant >= kNumVariants)
    throw std::invalid_argument("variant=" + std::to_string(variant) + ": must be in [0, " +
                                std::to_string(kNumVariants) + ")");
  if (buffers < 1) throw std::invalid_argument("buffers=" + std::to_string(buffers) + ": must be >= 1");
  if (max_pair_ops + max_paged_ops < 1 || max_pair_ops + max_paged_ops >= (size_t{1} << 30))
    throw std::invalid_argument("max_pair_ops + max_paged_ops must be in [1, 2**30)");
  Impl& m = *impl_;
  m.device = device;
  m.host_moves = host_moves;
  m.build = host_moves ? kHostBuild : kVariants[variant];
  m.planner_serial = planner.serial();
  m.max_pairs = max_pair_ops;
  m.max_paged = max_paged_ops;
  m.max_units = max_paged_ops * static_cast<size_t>(planner.units_per_image());
  m.capacity_bytes =
      sizeof(BatchHeader) + (max_pair_ops + max_paged_ops) * sizeof(OpDesc) + m.max_units * sizeof(int32_t);
  m.capacity_bytes = (m.capacity_bytes + 15) / 16 * 16;  // fetched in 16-byte words
  m.paged_pieces = planner.paged_template();
  m.run_bytes = static_cast<uint64_t>(planner.image_bytes()) / std::max<size_t>(1, m.paged_pieces.size());
  std::vector<TemplatePiece> items;
  append_items(planner.slot_template(), items);
  m.slot_items = static_cast<uint32_t>(items.size());
  append_items(planner.paged_template(), items);
  if (items.size() >= UINT32_MAX) throw std::invalid_argument("the layout's templates are too large");
  m.paged_items = static_cast<uint32_t>(items.size()) - m.slot_items;
  m.run_item_bytes = static_cast<uint64_t>(planner.image_bytes()) / std::max<uint32_t>(1, m.paged_items);
  DeviceGuard guard(device);
  check(gpuDeviceGetAttribute(&m.sms, gpuDevAttrMultiProcessorCount, device), "read SM count");
  int per_sm = 0;
  check(gpuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, m.build.staged, m.build.threads, 0), "read occupancy");
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
  m.check_batch(batch);
  const int dir = m.host_moves ? m.direction(batch) : 0;
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
  m.staged_direction = dir;
  m.staged_items = m.items_of(batch);
}

void GpuCopyEngine::launch(uintptr_t stream_handle, bool full_transfer, bool copy_descriptors) {
  Impl& m = *impl_;
  if (m.current < 0 && !full_transfer) throw std::logic_error("launch before stage");
  if (m.current < 0) m.current = 0, m.staged_bytes = sizeof(BatchHeader);  // the empty batch
  auto stream = reinterpret_cast<gpuStream_t>(stream_handle);
  DeviceGuard guard(m.device);
  const int blocks = m.host_moves ? m.blocks_for(m.staged_direction) : m.grid;
  if (copy_descriptors) {
    const uint32_t words = static_cast<uint32_t>(((full_transfer ? m.capacity_bytes : m.staged_bytes) + 15) / 16);
    fetch_descriptors_kernel<<<(words + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
        reinterpret_cast<uint4*>(m.dev[m.current]), reinterpret_cast<const uint4*>(m.host_mapped[m.current]), words);
    check(gpuGetLastError(), "launch descriptor fetch");
  }
  // A capture serves any later batch: one launch over whatever is staged.
  const bool all = full_transfer || !m.host_moves;
  m.enqueue_copy(stream, blocks, m.dev[m.current], all ? 0 : m.staged_items,
                 all ? kAllItems : m.slice_items(m.staged_direction));
  if (!capturing(stream)) {
    check(gpuEventRecord(m.consumed[m.current], stream), "record event");
    m.pending[m.current] = true;
  }
}

HostPath GpuCopyEngine::submit(const CompiledBatch& batch, uintptr_t stream_handle, HostPath path) {
  Impl& m = *impl_;
  if (batch.planner_serial != m.planner_serial)
    throw std::invalid_argument("the batch was compiled for another layout");
  if (!m.host_moves && path != HostPath::kAuto)
    throw std::invalid_argument("path: only a host-move engine chooses between SM and DMA");
  const int dir = m.host_moves ? m.direction(batch) : 0;
  if (batch.ops.empty()) return HostPath::kAuto;
  auto stream = reinterpret_cast<gpuStream_t>(stream_handle);
  DeviceGuard guard(m.device);
  int blocks = m.grid;
  if (m.host_moves) {
    if (path == HostPath::kAuto) {
      if (!m.link) m.link = &host_link_profile(m.device);
      path = m.run_bytes >= m.link->crossover[dir] ? HostPath::kDma : HostPath::kSm;
    }
    if (path == HostPath::kDma) {  // no staging: any size goes at once
      m.dma(batch, stream);
      return path;
    }
    if (batch.num_paged_ops > m.max_paged) {
      // The SM path stages at most max_paged ops at a time: slices in order
      // (the ops of one batch write disjoint bytes, so any split is the same).
      const size_t k = batch.unit_ids.size() / batch.num_paged_ops;
      for (size_t lo = 0; lo < batch.ops.size(); lo += m.max_paged) {
        const size_t hi = std::min(batch.ops.size(), lo + m.max_paged);
        CompiledBatch part;
        part.planner_serial = batch.planner_serial;
        part.num_paged_ops = static_cast<uint32_t>(hi - lo);
        part.ops.assign(batch.ops.begin() + static_cast<ptrdiff_t>(lo), batch.ops.begin() + static_cast<ptrdiff_t>(hi));
        for (OpDesc& op : part.ops) op.other -= static_cast<int64_t>(lo * k);
        part.unit_ids.assign(batch.unit_ids.begin() + static_cast<ptrdiff_t>(lo * k),
                             batch.unit_ids.begin() + static_cast<ptrdiff_t>(hi * k));
        submit(part, stream_handle, HostPath::kSm);
      }
      return HostPath::kSm;
    }
    blocks = m.blocks_for(dir);
  }
  m.check_batch(batch);
  if (Impl::batch_bytes(batch) <= kInlineBytes && !capturing(stream)) {
    m.launch_inline(batch, stream, blocks, m.slice_items(dir));
    return HostPath::kSm;
  }
  stage(batch);
  launch(stream_handle);
  return HostPath::kSm;
}

void GpuCopyEngine::set_dma_batch(size_t runs) {
  if (!impl_->host_moves) throw std::invalid_argument("DMA batches: not a host-move engine");
  impl_->dma_batch = runs;
}

void GpuCopyEngine::set_sm_slice_bytes(uint64_t bytes) {
  if (!impl_->host_moves) throw std::invalid_argument("SM slices: not a host-move engine");
  impl_->slice_bytes = bytes;
}

void GpuCopyEngine::set_host_blocks(int to_host, int from_host) {
  Impl& m = *impl_;
  if (!m.host_moves) throw std::invalid_argument("host blocks: not a host-move engine");
  for (int v : {to_host, from_host})
    if (v < 0 || v > m.sms * 8)
      throw std::invalid_argument("host blocks=" + std::to_string(v) + ": must be in [0, " + std::to_string(m.sms * 8) +
                                  "] (0: the measured count)");
  m.host_blocks[0] = to_host;
  m.host_blocks[1] = from_host;
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
bool GpuCopyEngine::host_moves() const { return impl_->host_moves; }
int GpuCopyEngine::host_blocks(bool to_host) { return impl_->host_moves ? impl_->blocks_for(to_host ? 0 : 1) : 0; }
size_t GpuCopyEngine::max_pair_ops() const { return impl_->max_pairs; }
size_t GpuCopyEngine::max_paged_ops() const { return impl_->max_paged; }
size_t GpuCopyEngine::staging_bytes() const { return impl_->capacity_bytes; }
uint32_t GpuCopyEngine::items_per_paged_op() const { return impl_->paged_items; }
uint32_t GpuCopyEngine::items_per_slot_copy() const { return impl_->slot_items; }
uint64_t GpuCopyEngine::paged_run_bytes() const { return impl_->run_bytes; }
size_t GpuCopyEngine::item_bytes() { return kItemBytes; }
size_t GpuCopyEngine::inline_bytes() { return kInlineBytes; }
int GpuCopyEngine::num_variants() { return kNumVariants; }

// ---- the host link, measured once per device ------------------------------

namespace {

// Device and pinned host buffers freed on every path out.
struct ProbeBuffers {
  int device = 0;
  unsigned char* dev = nullptr;
  unsigned char* host = nullptr;
  gpuStream_t stream = nullptr;
  gpuEvent_t start = nullptr, stop = nullptr;
  ~ProbeBuffers() {
    if (stream) (void)gpuStreamSynchronize(stream);
    if (start) (void)gpuEventDestroy(start);
    if (stop) (void)gpuEventDestroy(stop);
    if (stream) (void)gpuStreamDestroy(stream);
    if (dev) (void)gpuFree(dev);
    if (host) (void)gpuFreeHost(host);
  }
};

HostLinkProfile measure_host_link(int device) {
  // Each timing moves 2048 rows (as many runs as a real move has: DMA pays
  // per run), between 16 and 128 MiB.
  constexpr uint64_t kMinPayload = uint64_t{16} << 20, kMaxPayload = uint64_t{128} << 20;
  constexpr int kReps = 3;
  auto payload_of = [&](uint64_t row) {
    return std::clamp<uint64_t>(2048 * row, kMinPayload, kMaxPayload) / row * row;
  };
  HostLinkProfile prof;
#ifdef SC_HAVE_MEMCPY_BATCH
  prof.batch_dma = true;
#endif
  DeviceGuard guard(device);
  check(gpuDeviceGetAttribute(&prof.sm_count, gpuDevAttrMultiProcessorCount, device), "read SM count");
  ProbeBuffers b;
  b.device = device;
  // Device rows sit twice their length apart, so no two runs merge into one.
  check(gpuMalloc(reinterpret_cast<void**>(&b.dev), 2 * kMaxPayload), "allocate the host-link probe");
  check(gpuHostAlloc(reinterpret_cast<void**>(&b.host), kMaxPayload, gpuHostAllocMapped | gpuHostAllocPortable),
        "allocate the pinned host-link probe");
  void* mapped = nullptr;
  prof.sm_access = gpuHostGetDevicePointer(&mapped, b.host, 0) == gpuSuccess && mapped == b.host;
  (void)gpuGetLastError();
  check(gpuMemset(b.dev, 0x5a, 2 * kMaxPayload), "fill the probe");
  std::memset(b.host, 0xa5, kMaxPayload);
  check(gpuStreamCreateWithFlags(&b.stream, gpuStreamNonBlocking), "create a stream");
  check(gpuEventCreate(&b.start), "create event");
  check(gpuEventCreate(&b.stop), "create event");

  // GB/s of moving rows of `row` bytes one way, best of kReps; `slice`: SM
  // bytes per launch (~0: one launch). Rows move between device and host rows
  // in two pseudo-random orders (odd multipliers permute a power of two),
  // scattered on both sides as a tier's units and arena entries are: DMA
  // runs slower on scattered runs than on sequential ones.
  auto rate = [&](uint64_t row, bool to_host, HostPath path, int blocks, uint64_t slice) {
    const int64_t n = static_cast<int64_t>(payload_of(row) / row);
    const auto r = static_cast<int64_t>(row);
    SpanPlanner planner({{reinterpret_cast<uint64_t>(b.dev), 2 * r, r}},
                        {{reinterpret_cast<uint64_t>(b.dev), 2 * r, r}}, {{reinterpret_cast<uint64_t>(b.host), r, r}},
                        n, n, "host-link-probe");
    MaintenanceBatch mb;
    auto& ops = to_host ? mb.stores : mb.restores;
    ops.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ops[i] = {(i * 0x85EBCA77LL) % n, {(i * 0x9E3779B1LL) % n}, r, "host-link-probe"};
    const CompiledBatch batch = planner.compile(mb);
    GpuCopyEngine engine(device, planner, 0, static_cast<size_t>(n), 1, 0, true);
    engine.set_host_blocks(blocks, blocks);
    engine.set_sm_slice_bytes(slice);
    const auto handle = reinterpret_cast<uintptr_t>(b.stream);
    engine.submit(batch, handle, path);  // warm-up
    float best = std::numeric_limits<float>::infinity();
    for (int k = 0; k < kReps; ++k) {
      check(gpuEventRecord(b.start, b.stream), "record event");
      engine.submit(batch, handle, path);
      check(gpuEventRecord(b.stop, b.stream), "record event");
      check(gpuEventSynchronize(b.stop), "wait for the probe");
      float ms = 0;
      check(gpuEventElapsedTime(&ms, b.start, b.stop), "read the probe's time");
      best = std::min(best, ms);
    }
    const double gbs = static_cast<double>(n) * static_cast<double>(row) / (static_cast<double>(best) * 1e6);
    prof.samples.push_back({to_host, path == HostPath::kDma, row, path == HostPath::kDma ? 0 : blocks, gbs});
    return gbs;
  };

  const uint64_t rows[] = {4096, 8192, 16384, 32768, 65536, 131072, 262144, 1048576};
  for (int dir = 0; dir < 2; ++dir) {
    const bool to_host = dir == 0;
    if (!prof.sm_access) {  // DMA only: kernels cannot reach pinned memory here
      prof.crossover[dir] = 0;
      for (uint64_t row : rows) rate(row, to_host, HostPath::kDma, 0, 0);
      continue;
    }
    // The SM cap: the fewest blocks within 5% of the best count, on the
    // smallest rows (where the SM path is used), in one launch.
    std::vector<std::pair<int, double>> caps;
    for (int g = 1; g <= std::min(64, prof.sm_count); g *= 2)
      caps.push_back({g, rate(rows[0], to_host, HostPath::kSm, g, kOneLaunch)});
    double top = 0;
    for (auto& c : caps) top = std::max(top, c.second);
    for (auto& c : caps)
      if (c.second >= 0.95 * top) {
        prof.blocks[dir] = c.first;
        prof.slice_bytes[dir] =
            to_host ? std::max<uint64_t>(uint64_t{64} << 10, static_cast<uint64_t>(c.second * 1e9 * kSliceSeconds))
                    : kOneLaunch;
        break;
      }
    // The crossover: the shortest row from which DMA (which takes no SM) is
    // within 10% of the sliced SM path at every longer row measured.
    std::vector<bool> dma_wins;
    for (uint64_t row : rows) {
      const double sm = rate(row, to_host, HostPath::kSm, prof.blocks[dir], prof.slice_bytes[dir]);
      const double dma = rate(row, to_host, HostPath::kDma, 0, 0);
      dma_wins.push_back(dma >= 0.9 * sm);
    }
    prof.crossover[dir] = std::numeric_limits<uint64_t>::max();
    for (size_t i = dma_wins.size(); i-- > 0 && dma_wins[i];) prof.crossover[dir] = rows[i];
  }
  return prof;
}

// STATECACHE_HOST_LINK="blocks_to,blocks_from,crossover_to,crossover_from[,slice]"
// fixes the profile instead of measuring it (sanitizer runs, where timing
// means nothing and a probe takes minutes). Throws std::invalid_argument for
// a malformed value.
bool host_link_from_env(int device, HostLinkProfile& prof) {
  const char* v = std::getenv("STATECACHE_HOST_LINK");
  if (!v || !*v) return false;
  unsigned long long x[5] = {0, 0, 0, 0, uint64_t{1} << 21};
  const int n = std::sscanf(v, "%llu,%llu,%llu,%llu,%llu", &x[0], &x[1], &x[2], &x[3], &x[4]);
  if (n < 4 || x[0] < 1 || x[1] < 1 || x[0] > 1024 || x[1] > 1024 || x[4] < 1)
    throw std::invalid_argument(
        std::string("STATECACHE_HOST_LINK='") + v +
        "': want blocks_to_host,blocks_from_host,crossover_to_host,crossover_from_host[,slice]");
  DeviceGuard guard(device);
  check(gpuDeviceGetAttribute(&prof.sm_count, gpuDevAttrMultiProcessorCount, device), "read SM count");
  prof.sm_access = true;
#ifdef SC_HAVE_MEMCPY_BATCH
  prof.batch_dma = true;
#endif
  prof.blocks[0] = static_cast<int>(x[0]);
  prof.blocks[1] = static_cast<int>(x[1]);
  prof.crossover[0] = x[2];
  prof.crossover[1] = x[3];
  prof.slice_bytes[0] = x[4];
  prof.slice_bytes[1] = kOneLaunch;
  return true;
}

}  // namespace

const HostLinkProfile& host_link_profile(int device) {
  static std::mutex mutex;
  static std::map<int, std::unique_ptr<HostLinkProfile>> profiles;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = profiles.find(device);
  if (it == profiles.end()) {
    auto prof = std::make_unique<HostLinkProfile>();
    if (!host_link_from_env(device, *prof)) *prof = measure_host_link(device);
    it = profiles.emplace(device, std::move(prof)).first;
  }
  return *it->second;
}

bool host_memory_mapped(int device, uintptr_t address, size_t bytes) {
  if (bytes == 0) return false;
  DeviceGuard guard(device);
  for (uintptr_t a : {address, address + bytes - 1}) {
    void* mapped = nullptr;
    const gpuError_t err = gpuHostGetDevicePointer(&mapped, reinterpret_cast<void*>(a), 0);
    if (err != gpuSuccess || reinterpret_cast<uintptr_t>(mapped) != a) {
      (void)gpuGetLastError();
      return false;
    }
  }
  return true;
}

}  // namespace statecache
