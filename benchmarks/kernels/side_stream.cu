// An eager two-list prefill next to a long kernel of another stream: how long the call takes to
// complete on the GPU, with the default launch choice (one cooperative launch for plans of one
// wave) and with DSA_FLAG_NO_COOPERATIVE (two ordinary launches). The other stream's kernel holds
// `blocks` blocks of 128 threads for 2 ms (a communication kernel, say: one block on each of
// `blocks` SMs), started 200 us before the call. It prefers the largest shared-memory carveout:
// an SM configured for a kernel without shared memory takes no prefill block (they use shared
// memory) until it is idle, which would hide the effect measured here behind another one. Median
// of 7 runs. Build and run (on a GPU
// machine, from the repository root):
//   nv="nvcc -arch=sm_90 -O3 -std=c++17 --expt-relaxed-constexpr -Inative/include"
//   $nv benchmarks/kernels/side_stream.cu native/src/abi.cu native/src/plan.cpp native/src/c128.cu \
//     native/src/metadata_copy.cu -o /tmp/side_stream && /tmp/side_stream
#include <cuda_runtime.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>
#include "dsa_kernels.h"
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s line %d\n", cudaGetErrorString(e), __LINE__); exit(1);} } while (0)

__global__ void hold(long long cycles) { const long long t0 = clock64(); while (clock64() - t0 < cycles) {} }

int main() {
  setvbuf(stdout, nullptr, _IONBF, 0);
  const int D = 512;
  int clock_khz = 0;
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  const long long hold_cycles = 2LL * clock_khz * 1000 / 1000;  // 2 ms at the SM clock
  CK(cudaFuncSetAttribute(hold, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
  cudaStream_t a, b;
  CK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  cudaEvent_t done_a, done_b;
  CK(cudaEventCreateWithFlags(&done_a, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&done_b, cudaEventDisableTiming));
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-2, 2);
  struct Case { const char* name; std::vector<int64_t> ext, prefix; };
  const Case cases[] = {{"4 x 1K with prefixes (36 records, 288 items)", {1024, 1024, 1024, 1024}, {1692, 3423, 4089, 1154}},
                        {"2 x 4K with prefixes (66 records, 528 items)", {4096, 4096}, {1692, 3423}}};
  for (const Case& c : cases) {
    const int64_t B = (int64_t)c.ext.size();
    int64_t N = 0;
    std::vector<int64_t> seq(B);
    for (int64_t i = 0; i < B; ++i) N += c.ext[i], seq[i] = c.ext[i] + c.prefix[i];
    const int64_t cap = dsa_c128_compress_capacity(N, B);
    std::vector<dsa_segment> comp(cap), wr(B);
    int64_t nc = 0, nw = 0;
    dsa_plan_params pp{};
    pp.struct_size = sizeof pp, pp.batch_size = B, pp.num_tokens = N, pp.seq_lens = seq.data(), pp.extend_lens = c.ext.data();
    pp.compress = comp.data(), pp.write = wr.data(), pp.compress_capacity = cap, pp.write_capacity = B;
    pp.num_compress = &nc, pp.num_write = &nw;
    if (dsa_c128_plan_prefill(&pp) != DSA_STATUS_OK) { printf("plan failed: %s\n", dsa_last_error()); return 1; }
    std::vector<float> kv_h(N * 2 * D), st_h(B * 3 * D), ape_h(DSA_CHUNK * D);
    for (auto* v : {&kv_h, &st_h, &ape_h}) for (float& x : *v) x = u(rng);
    for (int64_t i = 0; i < B; ++i) for (int d = 0; d < D; ++d) st_h[i * 3 * D + D + d] = 1.5f + st_h[i * 3 * D + D + d];
    std::vector<int32_t> idx_h(B);
    for (int64_t i = 0; i < B; ++i) idx_h[i] = (int32_t)i;
    float *kv, *st, *ape, *out;
    int32_t* idx;
    CK(cudaMalloc(&kv, kv_h.size() * 4)); CK(cudaMalloc(&st, st_h.size() * 4)); CK(cudaMalloc(&ape, ape_h.size() * 4));
    CK(cudaMalloc(&out, (size_t)N * D * 4)); CK(cudaMalloc(&idx, B * 4));
    CK(cudaMemcpy(kv, kv_h.data(), kv_h.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(ape, ape_h.data(), ape_h.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(idx, idx_h.data(), B * 4, cudaMemcpyHostToDevice));
    dsa_c128_prefill_params q{};
    q.struct_size = sizeof q, q.device = 0, q.head_dim = D, q.num_slots = B, q.batch_size = B, q.num_tokens = N;
    q.state = st, q.kv_score = kv, q.out = out, q.ape = ape, q.indices = idx;
    q.compress = comp.data(), q.write = wr.data(), q.compress_capacity = nc, q.write_capacity = nw;
    for (int blocks : {0, 16, 132}) {
      for (uint32_t extra : {0u, (uint32_t)DSA_FLAG_NO_COOPERATIVE}) {
        q.flags = DSA_FLAG_HOST_PLAN | extra;
        std::vector<double> took;
        int overlapped = 0;
        for (int run = 0; run < 8; ++run) {
          CK(cudaMemcpy(st, st_h.data(), st_h.size() * 4, cudaMemcpyHostToDevice));
          CK(cudaDeviceSynchronize());
          if (blocks > 0) hold<<<blocks, 128, 0, b>>>(hold_cycles);
          CK(cudaEventRecord(done_b, b));
          std::this_thread::sleep_for(std::chrono::microseconds(200));
          const auto t0 = std::chrono::steady_clock::now();
          if (dsa_c128_prefill(&q, a) != DSA_STATUS_OK) { printf("prefill failed: %s\n", dsa_last_error()); return 1; }
          CK(cudaEventRecord(done_a, a));
          CK(cudaEventSynchronize(done_a));
          const auto t1 = std::chrono::steady_clock::now();
          const bool other_running = cudaEventQuery(done_b) == cudaErrorNotReady;
          CK(cudaDeviceSynchronize());
          if (run == 0) continue;  // warm-up
          took.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
          overlapped += other_running;
        }
        std::sort(took.begin(), took.end());
        printf("%s | other stream: %3d blocks x 2 ms | %-15s | call done after %8.1f us (median of %zu; min %.1f, max %.1f) | other kernel still running at that point in %d of %zu\n",
               c.name, blocks, extra ? "no cooperative" : "default", took[took.size() / 2], took.size(), took.front(), took.back(),
               overlapped, took.size());
      }
    }
    CK(cudaFree(kv)); CK(cudaFree(st)); CK(cudaFree(ape)); CK(cudaFree(out)); CK(cudaFree(idx));
  }
  return 0;
}
