// One-launch batched span copy for CUDA and HIP (see copy_kernels.h for the
// contract). A persistent grid deals the batch's chunks (kChunkBytes of one
// span each) out to blocks in rounds of neighbouring ranges; a block finds
// its first span with a block-wide search over the descriptors, then walks
// forward, moving each span piece with 16-byte vectors, kUnroll loads in
// flight per thread before the first store.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/copy_kernels.h"
#include "kernels/gpu_compat.h"

namespace statecache {

namespace {

// 512 threads x 2 vectors of 16 bytes in flight each, two blocks an SM at
// least: the fastest of eight builds timed on an H200 (see the README).
constexpr int kThreads = 512;
constexpr int kUnroll = 2;
constexpr int kMinBlocksPerSm = 2;
constexpr int kMaxThreadsPerSm = 2048;
constexpr uint32_t kChunkBytes = 16384;
constexpr uint32_t kRoundChunks = 4;

// Descriptor of one span. Entry 0 of a table is the header instead: `src`
// holds the span count and `dst` the chunk count, so a captured graph reads
// the batch size from memory rather than from its baked launch arguments.
struct SpanDesc {
  uint64_t src;
  uint64_t dst;
  uint32_t bytes;
  uint32_t first_chunk;  // chunks of all earlier spans
};
static_assert(sizeof(SpanDesc) == 24, "descriptor layout is shared with the host");

void check(gpuError_t err, const char* what) {
  if (err != gpuSuccess)
    throw std::runtime_error(std::string("statecache GPU copy: ") + what + ": " + gpuGetErrorString(err));
}

// Restores the caller's current device when it goes out of scope.
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

template <typename Word>
__device__ __forceinline__ void copy_words(Word* __restrict__ dst, const Word* __restrict__ src,
                                           uint64_t n) {
  uint64_t i = threadIdx.x;
  for (; i + (kUnroll - 1) * kThreads < n; i += kUnroll * kThreads) {
    Word v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = gpu_load(src + i + u * kThreads);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) gpu_store(dst + i + u * kThreads, v[u]);
  }
  for (; i < n; i += kThreads) gpu_store(dst + i, gpu_load(src + i));
}

// Block-wide copy of n bytes: a byte head up to the widest word both sides
// can share, words, then a byte tail.
__device__ void copy_range(unsigned char* dst, const unsigned char* src, uint64_t n) {
  const uintptr_t s = reinterpret_cast<uintptr_t>(src);
  const uintptr_t x = s ^ reinterpret_cast<uintptr_t>(dst);
  const uint32_t w = (x & 15) == 0 ? 16 : (x & 7) == 0 ? 8 : (x & 3) == 0 ? 4 : (x & 1) == 0 ? 2 : 1;
  uint64_t head = (w - (s & (w - 1))) & (w - 1);
  if (head > n) head = n;
  const uint64_t words = (n - head) / w;
  const uint64_t tail = head + words * w;
  for (uint64_t i = threadIdx.x; i < head; i += kThreads) dst[i] = src[i];
  for (uint64_t i = tail + threadIdx.x; i < n; i += kThreads) dst[i] = src[i];
  unsigned char* d = dst + head;
  const unsigned char* sv = src + head;
  switch (w) {
    case 16:
      copy_words(reinterpret_cast<uint4*>(d), reinterpret_cast<const uint4*>(sv), words);
      break;
    case 8:
      copy_words(reinterpret_cast<uint2*>(d), reinterpret_cast<const uint2*>(sv), words);
      break;
    case 4:
      copy_words(reinterpret_cast<uint32_t*>(d), reinterpret_cast<const uint32_t*>(sv), words);
      break;
    case 2:
      copy_words(reinterpret_cast<uint16_t*>(d), reinterpret_cast<const uint16_t*>(sv), words);
      break;
    default:
      copy_words(d, sv, words);
  }
}

// Copies chunks [c0, c1), starting the span search at `lo`; returns the span
// holding chunk c1 - 1, where the block's next search may start.
__device__ uint32_t copy_chunks(const SpanDesc* __restrict__ spans, uint32_t num_spans, uint32_t lo,
                                uint32_t c0, uint32_t c1) {
  // Last span with first_chunk <= c0: every thread samples one candidate,
  // the count of samples at or below c0 narrows the range kThreads-fold.
  uint32_t hi = num_spans;
  while (hi - lo > 1) {
    const uint32_t step = (hi - lo + kThreads - 1) / kThreads;
    const uint32_t idx = lo + threadIdx.x * step;
    const int below = idx < hi && spans[idx].first_chunk <= c0;
    const uint32_t count = static_cast<uint32_t>(__syncthreads_count(below));
    const uint32_t next_lo = lo + (count - 1) * step;
    hi = min(next_lo + step, hi);
    lo = next_lo;
  }
  uint32_t s = lo;
  for (uint32_t c = c0;; ++s) {
    const SpanDesc span = spans[s];
    const uint32_t span_end = span.first_chunk + (span.bytes + kChunkBytes - 1) / kChunkBytes;
    const uint32_t end = min(span_end, c1);
    const uint64_t off = uint64_t{c - span.first_chunk} * kChunkBytes;
    const uint64_t stop = min(uint64_t{end - span.first_chunk} * kChunkBytes, uint64_t{span.bytes});
    copy_range(reinterpret_cast<unsigned char*>(span.dst) + off,
               reinterpret_cast<const unsigned char*>(span.src) + off, stop - off);
    c = end;
    if (c >= c1) break;
  }
  return s;
}

// The batch is dealt out in rounds; in each, every block takes about
// kRoundChunks neighbouring chunks, so the grid sweeps the batch front to back
// together (measured faster on an H200 than one long range per block).
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm) copy_spans_kernel(const SpanDesc* __restrict__ table) {
  const uint32_t num_spans = static_cast<uint32_t>(table[0].src);
  const uint64_t num_chunks = table[0].dst;
  const SpanDesc* __restrict__ spans = table + 1;
  const uint64_t per_round = uint64_t{gridDim.x} * kRoundChunks;
  const uint64_t rounds = max(uint64_t{1}, (num_chunks + per_round - 1) / per_round);
  uint32_t lo = 0;
  for (uint64_t r = 0; r < rounds; ++r) {
    const uint64_t begin = num_chunks * r / rounds, size = num_chunks * (r + 1) / rounds - begin;
    const uint32_t c0 = static_cast<uint32_t>(begin + size * blockIdx.x / gridDim.x);
    const uint32_t c1 = static_cast<uint32_t>(begin + size * (blockIdx.x + 1) / gridDim.x);
    if (c0 < c1) lo = copy_chunks(spans, num_spans, lo, c0, c1);  // uniform across the block
  }
}

bool capturing(gpuStream_t stream) {
  gpuStreamCaptureStatus status;
  check(gpuStreamIsCapturing(stream, &status), "query stream capture");
  return status != gpuStreamCaptureStatusNone;
}

}  // namespace

struct GpuCopyEngine::Impl {
  int device = 0;
  int sms = 0;
  int grid = 0;
  size_t capacity = 0;
  std::vector<SpanDesc*> host;
  std::vector<SpanDesc*> dev;
  std::vector<gpuEvent_t> consumed;
  std::vector<bool> pending;
  int current = -1;
  size_t staged = 0;


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
    if (saved != device) (void)gpuSetDevice(saved);
  }
};

GpuCopyEngine::GpuCopyEngine(int device, size_t capacity_spans, int buffers)
    : impl_(std::make_unique<Impl>()) {
  if (buffers < 1) throw std::invalid_argument("buffers=" + std::to_string(buffers) + ": must be >= 1");
  if (capacity_spans < 1)
    throw std::invalid_argument("capacity_spans=" + std::to_string(capacity_spans) + ": must be >= 1");
  Impl& m = *impl_;
  m.device = device;
  m.capacity = capacity_spans;
  DeviceGuard guard(device);
  check(gpuDeviceGetAttribute(&m.sms, gpuDevAttrMultiProcessorCount, device), "read SM count");
  int per_sm = 0;
  check(gpuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, copy_spans_kernel, kThreads, 0),
        "read occupancy");
  m.grid = m.sms * std::max(1, std::min(per_sm, kMaxThreadsPerSm / kThreads));
  const size_t bytes = (capacity_spans + 1) * sizeof(SpanDesc);
  m.host.assign(buffers, nullptr);
  m.dev.assign(buffers, nullptr);
  m.consumed.assign(buffers, nullptr);
  m.pending.assign(buffers, false);
  for (int b = 0; b < buffers; ++b) {
    check(gpuHostAlloc(reinterpret_cast<void**>(&m.host[b]), bytes, gpuHostAllocDefault),
          "allocate pinned staging");
    check(gpuMalloc(reinterpret_cast<void**>(&m.dev[b]), bytes), "allocate descriptors");
    check(gpuEventCreateWithFlags(&m.consumed[b], gpuEventDisableTiming), "create event");
  }
}

GpuCopyEngine::~GpuCopyEngine() = default;

void GpuCopyEngine::stage(const CopyPlan& plan) {
  Impl& m = *impl_;
  if (plan.spans.size() > m.capacity)
    throw std::invalid_argument("the batch needs " + std::to_string(plan.spans.size()) +
                                " copy spans, the staging holds " + std::to_string(m.capacity));
  const int b = (m.current + 1) % static_cast<int>(m.host.size());
  if (m.pending[b]) {
    check(gpuEventSynchronize(m.consumed[b]), "wait for staging");
    m.pending[b] = false;
  }
  SpanDesc* out = m.host[b];
  uint64_t chunks = 0;
  for (size_t i = 0; i < plan.spans.size(); ++i) {
    const CopySpan& s = plan.spans[i];
    out[i + 1] = {s.src, s.dst, static_cast<uint32_t>(s.bytes), static_cast<uint32_t>(chunks)};
    chunks += (s.bytes + kChunkBytes - 1) / kChunkBytes;
  }
  if (chunks >= UINT32_MAX) throw std::invalid_argument("the batch is too large for one launch");
  out[0] = {plan.spans.size(), chunks, 0, 0};
  m.current = b;
  m.staged = plan.spans.size();
}

void GpuCopyEngine::launch(uintptr_t stream_handle, size_t min_transfer, bool copy_descriptors) {
  Impl& m = *impl_;
  if (m.current < 0) throw std::logic_error("launch before stage");
  if (min_transfer > m.capacity)
    throw std::invalid_argument("min_transfer=" + std::to_string(min_transfer) + " exceeds the capacity " +
                                std::to_string(m.capacity));
  auto stream = reinterpret_cast<gpuStream_t>(stream_handle);
  DeviceGuard guard(m.device);
  const size_t n = std::max(m.staged, min_transfer);
  if (copy_descriptors)
    check(gpuMemcpyAsync(m.dev[m.current], m.host[m.current], (n + 1) * sizeof(SpanDesc),
                         gpuMemcpyHostToDevice, stream),
          "copy descriptors");
  copy_spans_kernel<<<m.grid, kThreads, 0, stream>>>(m.dev[m.current]);
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
size_t GpuCopyEngine::capacity_spans() const { return impl_->capacity; }
size_t GpuCopyEngine::chunk_bytes() { return kChunkBytes; }

}  // namespace statecache
