// Batched copy of state maintenance spans on a CUDA or HIP device: one kernel
// launch per batch. Plain C++ interface (no GPU headers, no torch), so the
// bindings compile without a GPU toolchain; defined in copy_kernels.cu and
// only linked when STATECACHE_WITH_GPU is defined.
//
// Contract of a submitted batch:
//   * addresses are device memory of the engine's device, valid until the
//     batch has run; spans may start and end at any byte (16-byte vectors
//     where source and destination share their alignment mod 16, narrower
//     words where they share less, bytes for the rest);
//   * no span may write bytes another span of the same batch reads or writes:
//     all spans run concurrently (SpanPlanner::validate guarantees this);
//   * work is enqueued on `stream` (a cudaStream_t / hipStream_t passed as an
//     integer): one host-to-device copy of the descriptors from pinned staging,
//     then one kernel; both may be captured in a graph. A replay re-reads the
//     staging the capture used, so stage the new plan before each replay and
//     call record_consumed() after it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/span_planner.h"

namespace statecache {

class GpuCopyEngine {
 public:
  // `capacity_spans`: the most spans one batch may hold; `buffers`: staging
  // buffers used round robin, so the host can fill one while the device
  // still reads the other.
  GpuCopyEngine(int device, size_t capacity_spans, int buffers = 2);
  ~GpuCopyEngine();
  GpuCopyEngine(const GpuCopyEngine&) = delete;
  GpuCopyEngine& operator=(const GpuCopyEngine&) = delete;

  // Writes the plan's descriptors into the next staging buffer, first waiting
  // until the device has copied that buffer's previous contents.
  void stage(const CopyPlan& plan);
  // Enqueues the H2D copy of the staged descriptors (at least `min_transfer`
  // of them, so a graph captured with room for more serves later, larger
  // plans) and the kernel on `stream`. Without `copy_descriptors` the kernel
  // re-reads the device copy of an earlier launch (for timing the kernel).
  void launch(uintptr_t stream, size_t min_transfer = 0, bool copy_descriptors = true);
  // Marks the current staging buffer as read by work enqueued on `stream`
  // up to now (after a graph replay).
  void record_consumed(uintptr_t stream);
  void submit(const CopyPlan& plan, uintptr_t stream) {
    stage(plan);
    launch(stream);
  }

  int device() const;
  int num_sms() const;
  int grid_blocks() const;
  size_t capacity_spans() const;
  static size_t chunk_bytes();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace statecache
