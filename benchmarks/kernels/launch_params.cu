// Host time of one cudaLaunchKernelEx by the size of the kernel's parameters (1 block of 32
// threads, launched in blocks of 50 between stream syncs; median of 7 rounds of 40 blocks).
// Sizes the plan upload's parameter blocks (c128.cu). Build and run:
//   nvcc -arch=sm_90 -O3 -std=c++17 benchmarks/kernels/launch_params.cu -o /tmp/launch_params && /tmp/launch_params
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
#include <algorithm>
#include <vector>
template <int N> struct P { int v[N / 4]; };
template <int N> __global__ void k(const __grid_constant__ P<N> p, int* out) { if (p.v[threadIdx.x % (N / 4)] == 12345 && out) *out = 1; }
template <int N> double t() {
  P<N> p{}; cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaLaunchConfig_t c = {}; c.gridDim = 1; c.blockDim = 32; c.stream = s;
  std::vector<double> r;
  for (int round = 0; round < 7; ++round) {
    double total = 0; int calls = 0;
    for (int b = 0; b < 40; ++b) {
      cudaStreamSynchronize(s);
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 50; ++i) cudaLaunchKernelEx(&c, k<N>, p, (int*)nullptr);
      total += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count(); calls += 50;
    }
    r.push_back(total / calls);
  }
  std::sort(r.begin(), r.end()); return r[3];
}
int main() {
  for (int rep = 0; rep < 2; ++rep)
    printf("param bytes 16 %.2f | 256 %.2f | 1024 %.2f | 2048 %.2f | 4608 %.2f | 8192 %.2f | 16384 %.2f | 32000 %.2f us\n",
           t<16>(), t<256>(), t<1024>(), t<2048>(), t<4608>(), t<8192>(), t<16384>(), t<32000>());
  return 0;
}
