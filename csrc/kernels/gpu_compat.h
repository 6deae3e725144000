// One spelling of the GPU runtime for CUDA and HIP, so copy_kernels.cu is a
// single source. Only what that file uses is mapped.
#pragma once

#if defined(__HIP_PLATFORM_AMD__) || defined(STATECACHE_GPU_HIP)
#include <hip/hip_runtime.h>
#define SC_GPU(name) hip##name
#define gpuHostAlloc hipHostMalloc
#define gpuHostAllocMapped hipHostMallocMapped
#define gpuHostAllocPortable hipHostMallocPortable
#define gpuHostGetDevicePointer hipHostGetDevicePointer
#define gpuFreeHost hipHostFree
#define gpuDevAttrMultiProcessorCount hipDeviceAttributeMultiprocessorCount
// HIP passes kernel arguments in memory: taking one's address needs no qualifier.
#define SC_GRID_CONSTANT
#else
#include <cuda_runtime.h>
#define SC_GPU(name) cuda##name
#define gpuHostAlloc cudaHostAlloc
#define gpuHostAllocMapped cudaHostAllocMapped
#define gpuHostAllocPortable cudaHostAllocPortable
#define gpuHostGetDevicePointer cudaHostGetDevicePointer
#define gpuFreeHost cudaFreeHost
#define gpuDevAttrMultiProcessorCount cudaDevAttrMultiProcessorCount
// A by-value kernel parameter read through a pointer stays in parameter space.
#define SC_GRID_CONSTANT __grid_constant__
// cudaMemcpyBatchAsync: CUDA 12.8 (with a failure index) and 13 (without).
#if CUDART_VERSION >= 12080
#define SC_HAVE_MEMCPY_BATCH 1
#endif
#endif

using gpuError_t = SC_GPU(Error_t);
using gpuStream_t = SC_GPU(Stream_t);
using gpuEvent_t = SC_GPU(Event_t);
using gpuStreamCaptureStatus = SC_GPU(StreamCaptureStatus);
#define gpuSuccess SC_GPU(Success)
#define gpuGetErrorString SC_GPU(GetErrorString)
#define gpuGetLastError SC_GPU(GetLastError)
#define gpuGetDevice SC_GPU(GetDevice)
#define gpuSetDevice SC_GPU(SetDevice)
#define gpuDeviceGetAttribute SC_GPU(DeviceGetAttribute)
#define gpuOccupancyMaxActiveBlocksPerMultiprocessor SC_GPU(OccupancyMaxActiveBlocksPerMultiprocessor)
#define gpuMalloc SC_GPU(Malloc)
#define gpuFree SC_GPU(Free)
#define gpuMemcpy SC_GPU(Memcpy)
#define gpuMemcpyAsync SC_GPU(MemcpyAsync)
#define gpuMemcpyHostToDevice SC_GPU(MemcpyHostToDevice)
#define gpuMemcpyDefault SC_GPU(MemcpyDefault)
#define gpuEventCreate SC_GPU(EventCreate)
#define gpuEventElapsedTime SC_GPU(EventElapsedTime)
#define gpuEventQuery SC_GPU(EventQuery)
#define gpuErrorNotReady SC_GPU(ErrorNotReady)
#define gpuStreamCreateWithFlags SC_GPU(StreamCreateWithFlags)
#define gpuStreamNonBlocking SC_GPU(StreamNonBlocking)
#define gpuStreamDestroy SC_GPU(StreamDestroy)
#define gpuStreamSynchronize SC_GPU(StreamSynchronize)
#define gpuMemset SC_GPU(Memset)
#define gpuEventCreateWithFlags SC_GPU(EventCreateWithFlags)
#define gpuEventDisableTiming SC_GPU(EventDisableTiming)
#define gpuEventDestroy SC_GPU(EventDestroy)
#define gpuEventRecord SC_GPU(EventRecord)
#define gpuEventSynchronize SC_GPU(EventSynchronize)
#define gpuStreamIsCapturing SC_GPU(StreamIsCapturing)
#define gpuStreamCaptureStatusNone SC_GPU(StreamCaptureStatusNone)

template <typename T>
__device__ __forceinline__ T gpu_load(const T* p) {
  return *p;
}

template <typename T>
__device__ __forceinline__ void gpu_store(T* p, T v) {
  *p = v;
}
#if !defined(__HIP_PLATFORM_AMD__) && !defined(STATECACHE_GPU_HIP)
// Pointers read from descriptors are generic to the compiler, which would
// emit generic LD/ST; the 16-byte path states the global space (LDG/STG.128).
template <>
__device__ __forceinline__ uint4 gpu_load(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
template <>
__device__ __forceinline__ void gpu_store(uint4* p, uint4 v) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
#endif
