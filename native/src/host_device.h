// DSA_HD: the qualifier of a function that both backends compile, the CUDA kernels (host and device) and the
// host backend (a plain inline function).
#pragma once

#if defined(__CUDACC__)
#define DSA_HD __host__ __device__ __forceinline__
#else
#define DSA_HD inline
#endif
