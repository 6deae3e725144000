// One spelling of the GPU runtime for CUDA and HIP, so copy_kernels.cu is a
// single source. Only what that file uses is mapped.
#pragma once

#if defined(__HIP_PLATFORM_AMD__) || defined(STATECACHE_GPU_HIP)
#include <hip/hip_runtime.h>
using gpuError_t = hipError_t;
using gpuStream_t = hipStream_t;
using gpuEvent_t = hipEvent_t;
using gpuStreamCaptureStatus = hipStreamCaptureStatus;
#define gpuSuccess hipSuccess
#define gpuGetErrorString hipGetErrorString
#define gpuGetLastError hipGetLastError
#define gpuGetDevice hipGetDevice
#define gpuSetDevice hipSetDevice
#define gpuDeviceGetAttribute hipDeviceGetAttribute
#define gpuDevAttrMultiProcessorCount hipDeviceAttributeMultiprocessorCount
#define gpuOccupancyMaxActiveBlocksPerMultiprocessor hipOccupancyMaxActiveBlocksPerMultiprocessor
#define gpuMalloc hipMalloc
#define gpuFree hipFree
#define gpuHostAlloc hipHostMalloc
#define gpuHostAllocDefault hipHostMallocDefault
#define gpuFreeHost hipHostFree
#define gpuMemcpyAsync hipMemcpyAsync
#define gpuMemcpyHostToDevice hipMemcpyHostToDevice
#define gpuEventCreateWithFlags hipEventCreateWithFlags
#define gpuEventDisableTiming hipEventDisableTiming
#define gpuEventDestroy hipEventDestroy
#define gpuEventRecord hipEventRecord
#define gpuEventSynchronize hipEventSynchronize
#define gpuStreamIsCapturing hipStreamIsCapturing
#define gpuStreamCaptureStatusNone hipStreamCaptureStatusNone
// Plain accesses: hipcc picks global loads for these pointers itself.
template <typename T> __device__ __forceinline__ T gpu_load_stream(const T* p) { return *p; }
template <typename T> __device__ __forceinline__ void gpu_store_stream(T* p, T v) { *p = v; }
template <typename T> __device__ __forceinline__ T gpu_load_global(const T* p) { return *p; }
template <typename T> __device__ __forceinline__ void gpu_store_global(T* p, T v) { *p = v; }
#else
#include <cuda_runtime.h>
using gpuError_t = cudaError_t;
using gpuStream_t = cudaStream_t;
using gpuEvent_t = cudaEvent_t;
using gpuStreamCaptureStatus = cudaStreamCaptureStatus;
#define gpuSuccess cudaSuccess
#define gpuGetErrorString cudaGetErrorString
#define gpuGetLastError cudaGetLastError
#define gpuGetDevice cudaGetDevice
#define gpuSetDevice cudaSetDevice
#define gpuDeviceGetAttribute cudaDeviceGetAttribute
#define gpuDevAttrMultiProcessorCount cudaDevAttrMultiProcessorCount
#define gpuOccupancyMaxActiveBlocksPerMultiprocessor cudaOccupancyMaxActiveBlocksPerMultiprocessor
#define gpuMalloc cudaMalloc
#define gpuFree cudaFree
#define gpuHostAlloc cudaHostAlloc
#define gpuHostAllocDefault cudaHostAllocDefault
#define gpuFreeHost cudaFreeHost
#define gpuMemcpyAsync cudaMemcpyAsync
#define gpuMemcpyHostToDevice cudaMemcpyHostToDevice
#define gpuEventCreateWithFlags cudaEventCreateWithFlags
#define gpuEventDisableTiming cudaEventDisableTiming
#define gpuEventDestroy cudaEventDestroy
#define gpuEventRecord cudaEventRecord
#define gpuEventSynchronize cudaEventSynchronize
#define gpuStreamIsCapturing cudaStreamIsCapturing
#define gpuStreamCaptureStatusNone cudaStreamCaptureStatusNone
// Pointers read from descriptors are generic to the compiler; these force
// global accesses (evict-first streaming, or the default cache policy).
template <typename T> __device__ __forceinline__ T gpu_load_stream(const T* p) { return __ldcs(p); }
template <typename T> __device__ __forceinline__ void gpu_store_stream(T* p, T v) { __stcs(p, v); }
template <typename T> __device__ __forceinline__ T gpu_load_global(const T* p) { return __ldcg(p); }
template <typename T> __device__ __forceinline__ void gpu_store_global(T* p, T v) { __stwb(p, v); }
#endif
