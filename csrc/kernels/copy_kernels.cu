// One-launch batched span copy for CUDA and HIP (see copy_kernels.h for the
// contract). A persistent grid splits the batch's chunks (kChunkBytes of one
// span each) into one contiguous range per block; a block finds its first
// span with a block-wide search over the descriptors, then walks forward,
// moving each span piece with 16-byte vectors, 8 (or 4) loads in flight per
// thread before the first store.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/copy_kernels.h"
#include "kernels/gpu_compat.h"

namespace statecache {

namespace {

constexpr int kThreads = 256;
constexpr uint32_t kChunkBytes = 16384;
constexpr int kMaxBlocksPerSm = 8;
// Kernel variants (GpuCopyEngine's `variant`): bit 0 drops the streaming
// cache hints, bit 1 keeps 4 instead of 8 vectors in flight per thread.
constexpr int kVariants = 4;

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

template <bool Stream, typename Word>
__device__ __forceinline__ Word load(const Word* p) {
  if constexpr (Stream) return gpu_load_stream(p);
  else return gpu_load_global(p);
}

template <bool Stream, typename Word>
__device__ __forceinline__ void store(Word* p, Word v) {
  if constexpr (Stream) gpu_store_stream(p, v);
  else gpu_store_global(p, v);
}

template <bool Stream, int Unroll, typename Word>
__device__ __forceinline__ void copy_words(Word* __restrict__ dst, const Word* __restrict__ src,
                                           uint64_t n) {
  uint64_t i = threadIdx.x;
  for (; i + (Unroll - 1) * kThreads < n; i += Unroll * kThreads) {
    Word v[Unroll];
#pragma unroll
    for (int u = 0; u < Unroll; ++u) v[u] = load<Stream>(src + i + u * kThreads);
#pragma unroll
    for (int u = 0; u < Unroll; ++u) store<Stream>(dst + i + u * kThreads, v[u]);
  }
  for (; i < n; i += kThreads) store<Stream>(dst + i, load<Stream>(src + i));
}

// Block-wide copy of n bytes: a byte head up to the widest word both sides
// can share, words, then a byte tail.
template <bool Stream, int Unroll>
__device__ void copy_range(unsigned char* dst, const unsigned char* src, uint64_t n) {
  const uintptr_t s = reinterpret_cast<uintptr_t>(src);
  const uintptr_t x = s ^ reinterpret_cast<uintptr_t>(dst);
  const uint32_t w = (x & 15) == 0 ? 16 : (x & 7) == 0 ? 8 : (x & 3) == 0 ? 4 : (x & 1) == 0 ? 2 : 1;
  uint64_t head = (w - (s & (w - 1))) & (w - 1);
  if (head > n) head = n;
  const uint64_t words = (n - head) / w;
  const uint64_t tail = head + words * w;
  for (uint64_t i = threadIdx.x; i < head; i += kThreads) store<Stream>(dst + i, load<Stream>(src + i));
  for (uint64_t i = tail + threadIdx.x; i < n; i += kThreads) store<Stream>(dst + i, load<Stream>(src + i));
  unsigned char* d = dst + head;
  const unsigned char* sv = src + head;
  switch (w) {
    case 16:
      copy_words<Stream, Unroll>(reinterpret_cast<uint4*>(d), reinterpret_cast<const uint4*>(sv), words);
      break;
    case 8:
      copy_words<Stream, Unroll>(reinterpret_cast<uint2*>(d), reinterpret_cast<const uint2*>(sv), words);
      break;
    case 4:
      copy_words<Stream, Unroll>(reinterpret_cast<uint32_t*>(d), reinterpret_cast<const uint32_t*>(sv), words);
      break;
    case 2:
      copy_words<Stream, Unroll>(reinterpret_cast<uint16_t*>(d), reinterpret_cast<const uint16_t*>(sv), words);
      break;
    default:
      copy_words<Stream, Unroll>(d, sv, words);
  }
}

template <bool Stream, int Unroll>
__global__ void __launch_bounds__(kThreads, 4) copy_spans_kernel(const SpanDesc* __restrict__ table) {
  const uint32_t num_spans = static_cast<uint32_t>(table[0].src);
  const uint32_t num_chunks = static_cast<uint32_t>(table[0].dst);
  const SpanDesc* __restrict__ spans = table + 1;
  const uint32_t c0 = static_cast<uint32_t>(uint64_t{num_chunks} * blockIdx.x / gridDim.x);
  const uint32_t c1 = static_cast<uint32_t>(uint64_t{num_chunks} * (blockIdx.x + 1) / gridDim.x);
  if (c0 >= c1) return;  // uniform across the block

  // Last span with first_chunk <= c0: every thread samples one candidate,
  // the count of samples at or below c0 narrows the range kThreads-fold.
  uint32_t lo = 0, hi = num_spans;
  while (hi - lo > 1) {
    const uint32_t step = (hi - lo + kThreads - 1) / kThreads;
    const uint32_t idx = lo + threadIdx.x * step;
    const int below = idx < hi && spans[idx].first_chunk <= c0;
    const uint32_t count = static_cast<uint32_t>(__syncthreads_count(below));
    const uint32_t next_lo = lo + (count - 1) * step;
    hi = min(next_lo + step, hi);
    lo = next_lo;
  }

  for (uint32_t c = c0, s = lo; c < c1; ++s) {
    const SpanDesc span = spans[s];
    const uint32_t span_end = span.first_chunk + (span.bytes + kChunkBytes - 1) / kChunkBytes;
    const uint32_t end = min(span_end, c1);
    const uint64_t off = uint64_t{c - span.first_chunk} * kChunkBytes;
    const uint64_t stop = min(uint64_t{end - span.first_chunk} * kChunkBytes, uint64_t{span.bytes});
    copy_range<Stream, Unroll>(reinterpret_cast<unsigned char*>(span.dst) + off,
               reinterpret_cast<const unsigned char*>(span.src) + off, stop - off);
    c = end;
  }
}

using KernelFn = void (*)(const SpanDesc*);
constexpr KernelFn kKernels[kVariants] = {copy_spans_kernel<true, 8>, copy_spans_kernel<false, 8>,
                                          copy_spans_kernel<true, 4>, copy_spans_kernel<false, 4>};

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
  KernelFn kernel = nullptr;

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

GpuCopyEngine::GpuCopyEngine(int device, size_t capacity_spans, int buffers, int variant)
    : impl_(std::make_unique<Impl>()) {
  if (variant < 0 || variant >= kVariants)
    throw std::invalid_argument("variant=" + std::to_string(variant) + ": must be in [0, " +
                                std::to_string(kVariants) + ")");
  if (buffers < 1) throw std::invalid_argument("buffers=" + std::to_string(buffers) + ": must be >= 1");
  if (capacity_spans < 1)
    throw std::invalid_argument("capacity_spans=" + std::to_string(capacity_spans) + ": must be >= 1");
  Impl& m = *impl_;
  m.device = device;
  m.capacity = capacity_spans;
  m.kernel = kKernels[variant];
  DeviceGuard guard(device);
  check(gpuDeviceGetAttribute(&m.sms, gpuDevAttrMultiProcessorCount, device), "read SM count");
  int per_sm = 0;
  check(gpuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, m.kernel, kThreads, 0),
        "read occupancy");
  m.grid = m.sms * std::max(1, std::min(per_sm, kMaxBlocksPerSm));
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
  if (chunks > UINT32_MAX) throw std::invalid_argument("the batch is too large for one launch");
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
  m.kernel<<<m.grid, kThreads, 0, stream>>>(m.dev[m.current]);
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
