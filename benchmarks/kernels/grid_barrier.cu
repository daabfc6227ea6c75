// What a grid barrier costs: a cooperative grid of N blocks x 256 threads, CUDA graph of 20 launches,
// median of 30 replays. Half the blocks ("readers") load from global memory (two dependent round
// trips) and then arrive; the other half arrive at start, do the same loads and wait before their
// store. Modes: 0 no barrier; 1 cooperative groups' split barrier (arrive / wait); 2 a counter of
// our own (only readers arrive, waiters poll with backoff; a reset kernel before each launch);
// 3 cooperative groups' grid.sync() in every block at the end; 4 no barrier with the reset kernel
// (mode 2's baseline). Build and run: nvcc -arch=sm_90 -O3 -std=c++17 grid_barrier.cu && ./a.out
#include <cooperative_groups.h>
#include <cstdio>
#include <vector>
#include <algorithm>
namespace cg = cooperative_groups;
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s line %d\n", cudaGetErrorString(e), __LINE__); return 1;} } while (0)
__global__ void __launch_bounds__(256) k(int mode, const int* idx, const float* src, float* dst, unsigned* counter, int readers) {
  const bool reader = blockIdx.x < readers;
  __shared__ unsigned tok;
  if (mode == 1 && !reader) { unsigned t = cg::this_grid().barrier_arrive(); if (threadIdx.x == 0) tok = t; }
  int i = __ldg(idx + blockIdx.x);
  float v = src[(size_t)i * 256 + threadIdx.x];
  float w = src[(size_t)(((int)v) & 1023) * 256 + threadIdx.x];
  if (reader) {
    asm volatile("" :: "f"(w));
    if (mode == 1) { unsigned t = cg::this_grid().barrier_arrive(); (void)t; }
    if (mode == 2) { __syncthreads(); if (threadIdx.x == 0) { __threadfence(); atomicAdd(counter, 1u); } }
  } else {
    if (mode == 1) cg::this_grid().barrier_wait(std::move(tok));
    if (mode == 2) {
      if (threadIdx.x == 0) { volatile unsigned* c = counter; while (*c < (unsigned)readers) __nanosleep(32); __threadfence(); }
      __syncthreads();
    }
  }
  if (mode == 3) cg::this_grid().sync();
  dst[(size_t)blockIdx.x * 256 + threadIdx.x] = w;
}
__global__ void reset(unsigned* c) { *c = 0; }
int main() {
  int *idx; float *src, *dst; unsigned* counter;
  std::vector<int> h(1024); for (int i = 0; i < 1024; ++i) h[i] = (i * 37) % 1024;
  CK(cudaMalloc(&idx, 4096)); CK(cudaMalloc(&src, 1024 * 256 * 4)); CK(cudaMalloc(&dst, 1024 * 256 * 4)); CK(cudaMalloc(&counter, 4));
  cudaMemcpy(idx, h.data(), 4096, cudaMemcpyHostToDevice); cudaMemset(src, 0, 1024 * 256 * 4);
  cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  for (int n : {32, 128, 256, 528}) for (int mode : {0, 1, 2, 3, 4}) {
    int readers = n / 2;
    auto launch = [&]() {
      if (mode == 2 || mode == 4) reset<<<1, 1, 0, s>>>(counter);
      cudaLaunchAttribute at[1]; at[0].id = cudaLaunchAttributeCooperative; at[0].val.cooperative = 1;
      cudaLaunchConfig_t c = {}; c.gridDim = n; c.blockDim = 256; c.stream = s; c.attrs = at; c.numAttrs = 1;
      return cudaLaunchKernelEx(&c, k, mode, (const int*)idx, (const float*)src, dst, counter, readers);
    };
    CK(launch()); CK(cudaStreamSynchronize(s));
    cudaGraph_t g; cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < 20; ++i) launch();
    CK(cudaStreamEndCapture(s, &g)); CK(cudaGraphInstantiate(&ge, g, 0));
    std::vector<float> t;
    for (int r = 0; r < 30; ++r) { cudaEventRecord(a, s); cudaGraphLaunch(ge, s); cudaEventRecord(b, s); cudaEventSynchronize(b); float ms; cudaEventElapsedTime(&ms, a, b); t.push_back(ms * 1000 / 20); }
    std::sort(t.begin(), t.end());
    printf("blocks %d mode %d (%s) %.2f us%s\n", n, mode, mode == 0 ? "none" : mode == 1 ? "cg split" : mode == 2 ? "own counter" : mode == 3 ? "cg sync" : "none", t[15], mode >= 2 && mode != 3 ? " (includes a reset kernel)" : "");
  }
  // reset kernel alone
  return 0;
}
