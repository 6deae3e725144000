// Batched state copies on a CUDA or HIP device: one kernel launch per batch.
// Plain C++ interface (no GPU headers, no torch), so the bindings compile
// without a GPU toolchain; defined in copy_kernels.cu and only linked when
// STATECACHE_WITH_GPU is defined.
//
// The engine uploads its planner's templates (the pieces one PAGE op and one
// slot copy move, cut into work items of item_bytes()) to device memory once.
// A batch then costs the host one 24-byte descriptor per op plus its unit ids:
//   * addresses are device memory of the engine's device, valid until the
//     batch has run; pieces may start and end at any byte (16-byte vectors
//     where source and destination share their alignment mod 16, narrower
//     words where they share less, bytes for the rest);
//   * no op may write bytes another op of the same batch reads or writes: all
//     ops run concurrently (SpanPlanner::validate guarantees this);
//   * work is enqueued on `stream` (a cudaStream_t / hipStream_t passed as an
//     integer): a small kernel fetching the descriptors from mapped pinned
//     staging, then the copy kernel; both may be captured in a graph. A replay re-reads the
//     staging the capture used, so stage the new batch before each replay and
//     call record_consumed() after it.
// Not thread-safe: callers serialise stage/launch (the Python executor holds
// the GIL and its own lock around them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/span_planner.h"

namespace statecache {

class GpuCopyEngine {
 public:
  // Room for `max_pair_ops` relocations + copies and `max_paged_ops` stores +
  // restores per batch; `buffers` staging buffers used round robin, so the
  // host can fill one while the device still reads another; `variant` picks
  // one of num_variants() kernel builds (0, the default, unless benchmarking).
  GpuCopyEngine(int device, const SpanPlanner& planner, size_t max_pair_ops, size_t max_paged_ops, int buffers = 2,
                int variant = 0);
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
  void submit(const CompiledBatch& batch, uintptr_t stream) {
    stage(batch);
    launch(stream);
  }

  int device() const;
  int num_sms() const;
  int grid_blocks() const;
  size_t max_pair_ops() const;
  size_t max_paged_ops() const;
  size_t staging_bytes() const;
  uint32_t items_per_paged_op() const;
  uint32_t items_per_slot_copy() const;
  static size_t item_bytes();
  static int num_variants();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace statecache
