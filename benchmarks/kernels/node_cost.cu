// Device us per call of empty kernels in CUDA graphs, in a fresh context and after each of the
// kinds of work an engine's process runs before it replays graphs: a kernel with a large dynamic
// shared memory block, a cuBLAS handle, a cuBLAS matmul. It asks what makes kernel nodes cost more
// once torch has run a matmul (benchmarks/graph_nodes.py) and whether a kernel's shared memory
// carveout preference changes that. Each replay is timed from an idle GPU (as graph_nodes.py
// times them), so the host's submission of the replay is counted too. Standalone, GPU only.
// Build: nvcc -arch=sm_90 -O3 -std=c++17 benchmarks/kernels/node_cost.cu -lcublas -o node_cost
// Run:   ./node_cost [step ...], steps applied in order: smem (a 200 KB shared memory kernel),
//        handle (cublasCreate), sgemm (a 256 x 256 matmul), sgemm_big (4096 x 4096).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define CHECK(x)                                                                             \
  do {                                                                                       \
    cudaError_t e_ = (x);                                                                    \
    if (e_ != cudaSuccess) {                                                                 \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

__global__ void empty_default() {}
__global__ void empty_max_l1() {}
__global__ void empty_max_shared() {}
__global__ void large_shared(float* out) {
  extern __shared__ float s[];
  s[threadIdx.x] = (float)threadIdx.x;
  __syncthreads();
  if (out != nullptr) out[threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}

constexpr int kCalls = 20, kReplays = 30, kRounds = 5;

// Median device us per call over replays of a graph of kCalls calls, each `nodes` launches of k.
float graph_us(void (*k)(), int nodes, cudaStream_t s) {
  cudaGraph_t g;
  cudaGraphExec_t e;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < kCalls * nodes; ++i) k<<<1, 32, 0, s>>>();
  CHECK(cudaStreamEndCapture(s, &g));
  CHECK(cudaGraphInstantiate(&e, g, 0));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  CHECK(cudaGraphLaunch(e, s));
  CHECK(cudaStreamSynchronize(s));
  std::vector<float> t;
  for (int r = 0; r < kReplays; ++r) {
    CHECK(cudaEventRecord(a, s));
    CHECK(cudaGraphLaunch(e, s));
    CHECK(cudaEventRecord(b, s));
    CHECK(cudaEventSynchronize(b));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1e3f / kCalls);
  }
  std::sort(t.begin(), t.end());
  CHECK(cudaGraphExecDestroy(e));
  CHECK(cudaGraphDestroy(g));
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  return t[t.size() / 2];
}

void report(const char* after, cudaStream_t s) {
  struct Case {
    const char* name;
    void (*k)();
    int nodes;
  } cases[] = {{"default x1", empty_default, 1},       {"default x2", empty_default, 2},
               {"default x3", empty_default, 3},       {"max L1 x1", empty_max_l1, 1},
               {"max L1 x2", empty_max_l1, 2},         {"max shared x1", empty_max_shared, 1},
               {"max shared x2", empty_max_shared, 2}};
  constexpr int n = sizeof cases / sizeof cases[0];
  std::vector<float> got[n];
  for (int r = 0; r < kRounds; ++r)
    for (int c = 0; c < n; ++c) got[c].push_back(graph_us(cases[c].k, cases[c].nodes, s));
  std::printf("after %-34s", after);
  for (int c = 0; c < n; ++c) {
    std::sort(got[c].begin(), got[c].end());
    std::printf(" %s %.3f%s", cases[c].name, got[c][kRounds / 2], c + 1 < n ? "," : "\n");
  }
}

int main(int argc, char** argv) {
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK(cudaFuncSetAttribute(empty_max_l1, cudaFuncAttributePreferredSharedMemoryCarveout, 0));
  CHECK(cudaFuncSetAttribute(empty_max_shared, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s; device us per call, graphs of %d calls, median of %d rounds of %d replays\n", prop.name, kCalls,
              kRounds, kReplays);
  report("nothing", s);
  cublasHandle_t h = nullptr;
  float* m = nullptr;
  std::string done;
  for (int i = 1; i < argc; ++i) {
    const char* step = argv[i];
    if (!std::strcmp(step, "smem")) {
      const int bytes = 200 * 1024;
      CHECK(cudaFuncSetAttribute(large_shared, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
      large_shared<<<prop.multiProcessorCount, 256, bytes, s>>>(nullptr);
      CHECK(cudaGetLastError());
    } else if (!std::strcmp(step, "handle")) {
      if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return std::fprintf(stderr, "cublasCreate failed\n"), 1;
      cublasSetStream(h, s);
    } else if (!std::strncmp(step, "sgemm", 5)) {
      const int n = std::strcmp(step, "sgemm_big") ? 256 : 4096;
      if (h == nullptr) return std::fprintf(stderr, "sgemm needs handle first\n"), 1;
      if (m == nullptr) CHECK(cudaMalloc(&m, sizeof(float) * 3 * 4096 * 4096));
      CHECK(cudaMemsetAsync(m, 0, sizeof(float) * 3 * n * n, s));
      const float one = 1, zero = 0;
      if (cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, m, n, m + n * n, n, &zero, m + 2 * n * n, n) !=
          CUBLAS_STATUS_SUCCESS)
        return std::fprintf(stderr, "sgemm failed\n"), 1;
    } else {
      return std::fprintf(stderr, "unknown step %s\n", step), 1;
    }
    CHECK(cudaStreamSynchronize(s));
    done += done.empty() ? step : std::string(" + ") + step;
    report(done.c_str(), s);
  }
  return 0;
}
