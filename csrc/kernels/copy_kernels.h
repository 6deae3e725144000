// Batched state copies on a CUDA or HIP device: one kernel launch per batch.
// Plain C++ interface (no GPU headers, no torch), so the bindings compile
// without a GPU toolchain; defined in copy_kernels.cu and only linked when
// STATECACHE_WITH_GPU is defined.
//
// The engine uploads its planner's templates (the pieces one PAGE op and one
// slot copy move, cut into work items of item_bytes()) to device memory once.
// A batch then costs the host one 24-byte descriptor per op plus its unit ids:
//   * addresses are device memory of the engine's device (or, for a host-move
//     engine, pinned host memory the device can address), valid until the
//     batch has run; pieces may start and end at any byte (16-byte vectors
//     where source and destination share their alignment mod 16, narrower
//     words where they share less, bytes for the rest);
//   * no op may write bytes another op of the same batch reads or writes: all
//     ops run concurrently (SpanPlanner::validate guarantees this);
//   * work is enqueued on `stream` (a cudaStream_t / hipStream_t passed as an
//     integer). A small batch outside a capture travels in the kernel's
//     parameters (one launch, nothing staged); otherwise a small kernel
//     fetches the descriptors from mapped pinned staging, then the copy
//     kernel runs; both may be captured in a graph. A replay re-reads the
//     staging the capture used, so stage the new batch before each replay and
//     call record_consumed() after it.
// Host moves (`host_moves`): the planner's units are entries of a pinned host
// buffer; stores move device -> host, restores host -> device, one direction
// per batch. A batch goes either through the copy kernel on a few SMs (rows
// shorter than the measured crossover; an offload launched in slices of
// ~50 us so other kernels get those SMs back often) or as DMA (cudaMemcpyBatchAsync where the
// runtime has it, else one async memcpy per contiguous run); the SM count,
// slice and crossover are measured on the device the first time (host_link_profile).
// Not thread-safe: callers serialise stage/launch (the Python executor holds
// the GIL and its own lock around them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/span_planner.h"

namespace statecache {

// How a host-move batch travels.
enum class HostPath : int { kAuto = 0, kSm = 1, kDma = 2 };

// One start-up measurement: `row_bytes` rows moved one way by `blocks` copy
// blocks (sm) or by DMA.
struct HostLinkSample {
  bool to_host = true;
  bool dma = false;
  uint64_t row_bytes = 0;
  int blocks = 0;
  double gb_per_s = 0;
};

// What the device's link to pinned host memory does, measured once.
struct HostLinkProfile {
  bool sm_access = false;  // kernels can address pinned host memory (UVA)
  bool batch_dma = false;  // the runtime has a batched async memcpy
  int sm_count = 0;
  int blocks[2] = {1, 1};  // SM-path copy blocks, one SM each: [to host, from host]
  // Runs of at least this many bytes go by DMA: [to host, from host].
  uint64_t crossover[2] = {0, 0};
  // SM path: bytes per launch. Offloads: about 50 us of work, so a kernel
  // that needs every SM waits at most that long for the ones the copy
  // holds; loads: one launch (the work queued after a load waits for it).
  uint64_t slice_bytes[2] = {uint64_t{1} << 21, ~uint64_t{0} >> 1};
  std::vector<HostLinkSample> samples;
};

// Measures at the first call for `device` (a fraction of a second), then
// returns the cached profile; STATECACHE_HOST_LINK="blocks_to,blocks_from,
// crossover_to,crossover_from[,slice]" fixes it instead (sanitizer runs).
// Thread-safe. Throws std::runtime_error for a CUDA/HIP error.
const HostLinkProfile& host_link_profile(int device);

// True when `bytes` at `address` are pinned host memory that kernels on
// `device` address with the same pointer (what the SM path needs).
bool host_memory_mapped(int device, uintptr_t address, size_t bytes);

class GpuCopyEngine {
 public:
  // Room for `max_pair_ops` relocations + copies and `max_paged_ops` stores +
  // restores per batch; `buffers` staging buffers used round robin, so the
  // host can fill one while the device still reads another; `variant` picks
  // one of num_variants() kernel builds (0, the default, unless benchmarking).
  // `host_moves`: the planner's units live in pinned host memory (see above).
  GpuCopyEngine(int device, const SpanPlanner& planner, size_t max_pair_ops, size_t max_paged_ops, int buffers = 2,
                int variant = 0, bool host_moves = false);
  ~GpuCopyEngine();
  GpuCopyEngine(const GpuCopyEngine&) = delete;
  GpuCopyEngine& operator=(const GpuCopyEngine&) = delete;

  // Writes the batch's descriptors into the next staging buffer, first
  // waiting until the device has copied that buffer's previous contents.
  // Throws std::invalid_argument for a batch of another planner or one that
  // exceeds the capacity.
  void stage(const CompiledBatch& batch);
  // Enqueues the fetch of the staged descriptors (the whole staging with
  // `full_transfer`, so a graph captured now serves any later batch) and the
  // kernel on `stream`. Without `copy_descriptors` the kernel re-reads the
  // device copy of an earlier launch (for timing the kernel alone).
  void launch(uintptr_t stream, bool full_transfer = false, bool copy_descriptors = true);
  // Marks the current staging buffer as read by work enqueued on `stream`
  // up to now (after a graph replay).
  void record_consumed(uintptr_t stream);
  // Enqueues the batch on `stream`: in the kernel's parameters when it fits
  // and the stream is not capturing, else stage + launch. A host-move engine
  // picks SM or DMA (`path`, kAuto: by the measured crossover). Returns the
  // path taken (kSm for device copies). Throws as stage() does, and
  // std::invalid_argument for a host-move batch that mixes directions or
  // holds slot copies, or a path on a device-copy engine.
  HostPath submit(const CompiledBatch& batch, uintptr_t stream, HostPath path = HostPath::kAuto);
  // Host moves: SM-path blocks per direction (0: the measured count), and
  // bytes per SM-path launch (0: the measured slice; a huge value: one launch).
  void set_host_blocks(int to_host, int from_host);
  void set_sm_slice_bytes(uint64_t bytes);
  // Runs per batched-memcpy call of the DMA path (0: one memcpy per run).
  void set_dma_batch(size_t runs);
  int host_blocks(bool to_host);

  int device() const;
  int num_sms() const;
  int grid_blocks() const;
  bool host_moves() const;
  size_t max_pair_ops() const;
  size_t max_paged_ops() const;
  size_t staging_bytes() const;
  uint32_t items_per_paged_op() const;
  uint32_t items_per_slot_copy() const;
  // Mean bytes of one template piece of a PAGE op (what a host move's
  // crossover is compared with).
  uint64_t paged_run_bytes() const;
  static size_t item_bytes();
  static size_t inline_bytes();
  static int num_variants();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace statecache
