// Host time per launch of an empty kernel (1 block of 32 threads) through the runtime API and
// through the driver API reached with cudaGetDriverEntryPoint, with and without the programmatic
// stream serialization (PDL) attribute, at 16 B and 4.6 KB of parameters (blocks of 50 launches
// between stream syncs; median of 9 rounds of 40 blocks). Asks whether a prefill's second launch
// could be made cheaper on the host. Build and run:
//   nvcc -arch=sm_90 -O3 -std=c++17 benchmarks/kernels/launch_api.cu -o /tmp/launch_api && /tmp/launch_api
#include <cuda.h>
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
#include <vector>
#include <algorithm>
template <int N> struct P { int v[N / 4]; };
template <int N> __global__ void k(const __grid_constant__ P<N> p, int* out) { if (p.v[threadIdx.x % (N / 4)] == 12345 && out) *out = 1; }
typedef CUresult (*LaunchEx)(const CUlaunchConfig*, CUfunction, void**, void**);
typedef CUresult (*Launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void**, void**);
template <class F> double t(cudaStream_t s, F f) {
  std::vector<double> r;
  for (int round = 0; round < 9; ++round) {
    double total = 0; int calls = 0;
    for (int b = 0; b < 40; ++b) {
      cudaStreamSynchronize(s);
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 50; ++i) f();
      total += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count(); calls += 50;
    }
    r.push_back(total / calls);
  }
  std::sort(r.begin(), r.end()); return r[4];
}
template <int N> void row(cudaStream_t s, LaunchEx lex, Launch lk) {
  P<N> p{}; int* out = nullptr;
  cudaFunction_t fn; cudaGetFuncBySymbol(&fn, (const void*)k<N>);
  CUfunction cf = (CUfunction)fn;
  cudaLaunchAttribute at; at.id = cudaLaunchAttributeProgrammaticStreamSerialization; at.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t c = {}; c.gridDim = 1; c.blockDim = 32; c.stream = s;
  cudaLaunchConfig_t cp = c; cp.attrs = &at; cp.numAttrs = 1;
  CUlaunchAttribute cat; cat.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION; cat.value.programmaticStreamSerializationAllowed = 1;
  CUlaunchConfig cc = {}; cc.gridDimX = cc.gridDimY = cc.gridDimZ = 1; cc.blockDimX = 32; cc.blockDimY = cc.blockDimZ = 1; cc.hStream = (CUstream)s;
  CUlaunchConfig ccp = cc; ccp.attrs = &cat; ccp.numAttrs = 1;
  void* args[] = {&p, &out};
  double a = t(s, [&] { k<N><<<1, 32, 0, s>>>(p, out); });
  double b = t(s, [&] { cudaLaunchKernelEx(&c, k<N>, p, out); });
  double b2 = t(s, [&] { cudaLaunchKernelEx(&cp, k<N>, p, out); });
  double b3 = t(s, [&] { cudaLaunchKernel((const void*)k<N>, 1, 32, args, 0, s); });
  double d = t(s, [&] { lk(cf, 1, 1, 1, 32, 1, 1, 0, (CUstream)s, args, nullptr); });
  double e = t(s, [&] { lex(&cc, cf, args, nullptr); });
  double e2 = t(s, [&] { lex(&ccp, cf, args, nullptr); });
  printf("params %5d B: <<<>>> %.2f | cudaLaunchKernelEx %.2f | +PDL %.2f | cudaLaunchKernel %.2f | cuLaunchKernel %.2f | cuLaunchKernelEx %.2f | +PDL %.2f us  err %s\n",
         N, a, b, b2, b3, d, e, e2, cudaGetErrorString(cudaGetLastError()));
}
int main() {
  setvbuf(stdout, nullptr, _IONBF, 0);
  cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  void *pe = nullptr, *pk = nullptr; cudaDriverEntryPointQueryResult q;
  cudaGetDriverEntryPoint("cuLaunchKernelEx", &pe, cudaEnableDefault, &q);
  cudaGetDriverEntryPoint("cuLaunchKernel", &pk, cudaEnableDefault, &q);
  printf("entry points %p %p\n", pe, pk);
  for (int rep = 0; rep < 2; ++rep) { row<16>(s, (LaunchEx)pe, (Launch)pk); row<4608>(s, (LaunchEx)pe, (Launch)pk); }
  return 0;
}
