// Device time per call of dsa_c128_prefill, dsa_c128_decode and dsa_metadata_copy on fixed cases
// (CUDA graph of 20 calls, median of 30 replays, each behind a GPU spin), each result checked
// against the host backend first; for prefill also the host time per call and the device time per
// call of eager calls (both with the calls queued behind a GPU spin). Usage: kernel_times <tag>
// <cases file>; see compare.sh. Output lines: "<tag> prefill|decode <case> <graph us> ...", "<tag>
// hostprefill <case> <us>", "<tag> eagerprefill <case> <us>" (and the same for the empty kernel).
// With KB_PREFILL_ONLY set in the environment it stops after the prefill cases; with KB_BF16 the
// prefill cases keep their state in bf16 (case names gain "bf16"); with KB_DEVICE_PLAN=<tokens>
// their plans are device plans for a bucket of that many tokens (names gain "dev"). Last come the
// floors: "<tag> floor <case> <graph us> [launch shape]" (floors(), below).
#include <cuda_runtime.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>
#include "dsa_kernels.h"
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s line %d\n", cudaGetErrorString(e), __LINE__); exit(1);} } while (0)
static const int D = 512;
static std::mt19937 rng(7);
static std::vector<float> randv(size_t n, float lo, float hi) { std::uniform_real_distribution<float> u(lo, hi); std::vector<float> v(n); for (auto& x : v) x = u(rng); return v; }
template <class T> T* up(const std::vector<T>& v) { T* d; CK(cudaMalloc(&d, v.size() * sizeof(T) + 16)); CK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice)); return d; }
template <class T> std::vector<T> down(const T* d, size_t n) { std::vector<T> v(n); CK(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost)); return v; }

__global__ void spin_kernel(long long cycles) { long long t0 = clock64(); while (clock64() - t0 < cycles) {} }
// Each replay is timed behind a spin (about 0.1 ms), so the events time its device work and not
// the host's submission of it (as pydsa.bench.graph_us).
template <class F> double graph_us(F call, cudaStream_t s, int per = 20, int reps = 30) {
  cudaGraph_t g; cudaGraphExec_t ge;
  call(s); CK(cudaStreamSynchronize(s));
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < per; ++i) call(s);
  CK(cudaStreamEndCapture(s, &g)); CK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(ge, s));
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) { spin_kernel<<<1, 1, 0, s>>>(200000LL); cudaEventRecord(a, s); CK(cudaGraphLaunch(ge, s)); cudaEventRecord(b, s); CK(cudaEventSynchronize(b)); float ms; cudaEventElapsedTime(&ms, a, b); t.push_back(ms * 1000.0 / per); }
  std::sort(t.begin(), t.end());
  cudaGraphExecDestroy(ge); cudaGraphDestroy(g);
  return t[t.size() / 2];
}

// Host time per call with the GPU busy (a long spin queued first), so no call waits on the GPU.
template <class F> double host_us(F call, cudaStream_t s, int n = 300) {
  std::vector<double> t;
  for (int r = 0; r < 5; ++r) {
    spin_kernel<<<1, 1, 0, s>>>(40000000LL);
    for (int i = 0; i < 20; ++i) call(s);
    auto a = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) call(s);
    auto b = std::chrono::steady_clock::now();
    CK(cudaStreamSynchronize(s));
    t.push_back(std::chrono::duration<double, std::micro>(b - a).count() / n);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Device time per call of eager calls: the calls queue behind a spin, events time them on the GPU.
template <class F> double eager_us(F call, cudaStream_t s, int n = 200) {
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  std::vector<double> t;
  for (int r = 0; r < 5; ++r) {
    spin_kernel<<<1, 1, 0, s>>>(20000000LL);
    cudaEventRecord(a, s);
    for (int i = 0; i < n; ++i) call(s);
    cudaEventRecord(b, s);
    CK(cudaEventSynchronize(b));
    float ms; cudaEventElapsedTime(&ms, a, b); t.push_back(ms * 1000.0 / n);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Floors, printed as "<tag> floor <case> <graph us> [launch shape]": the same bytes moved by the
// simplest kernels. Metadata copy: the page table alone (the other fields are a few hundred bytes)
// from one contiguous source to K contiguous destinations, each thread loading kUnroll int4 before
// storing them, at its fastest launch shape; then at 128 x 2 with the parameters padded (bytes
// before / after the pointers: "/p<before>+<after>") and at the copy's own 64 x 8. Decode: per
// request the token, an ape row and three state rows loaded, three state rows stored; "1trip" loads
// them all at once (no slot or length to wait for), "2trip" first loads the slot and length, as the
// decode kernel must.
struct FloorCopy { const int4* src; int4* dst[3]; int64_t n4; int k; };
template <int kBefore, int kAfter> struct Padded { int64_t before[kBefore / 8 + 1]; FloorCopy a; int64_t after[kAfter / 8 + 1]; };
template <int kUnroll, class P>
__global__ void floor_copy(const __grid_constant__ P p) {
  const FloorCopy& a = p.a;
  const int64_t i0 = (int64_t)blockIdx.x * blockDim.x * kUnroll + threadIdx.x;
  int4 v[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u)
    if (i0 + u * blockDim.x < a.n4) v[u] = __ldg(a.src + i0 + u * blockDim.x);
#pragma unroll
  for (int j = 0; j < 3; ++j)
    if (j < a.k)
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (i0 + u * blockDim.x < a.n4) a.dst[j][i0 + u * blockDim.x] = v[u];
}
template <int kUnroll, int kBefore = 0, int kAfter = 0>
static double floor_copy_us(const FloorCopy& a, int block, cudaStream_t s) {
  Padded<kBefore, kAfter> p{};
  p.a = a;
  const unsigned grid = (unsigned)((a.n4 + (int64_t)block * kUnroll - 1) / ((int64_t)block * kUnroll));
  return graph_us([&](cudaStream_t st) { floor_copy<kUnroll><<<grid, block, 0, st>>>(p); }, s);
}
template <bool kTwoTrips>
__global__ void floor_decode(const float4* kv, const float4* ape, float4* state, const int32_t* slots, const int32_t* lens) {
  const int d4 = blockDim.x, b = blockIdx.x, c = threadIdx.x;
  const float4 x = __ldg(kv + (int64_t)b * 2 * d4 + c), y = __ldg(kv + (int64_t)b * 2 * d4 + d4 + c);
  const int slot = kTwoTrips ? __ldg(slots + b) : b, row = kTwoTrips ? (__ldg(lens + b) - 1) & 127 : b & 127;
  const float4 a = __ldg(ape + (int64_t)row * d4 + c);
  float4* st = state + (int64_t)slot * 3 * d4 + c;
  float4 m = st[0], t = st[d4], k = st[2 * d4];
  m.x += x.x + a.x, m.y += x.y + a.y, m.z += x.z + a.z, m.w += x.w + a.w;
  t.x += y.x, t.y += y.y, t.z += y.z, t.w += y.w;
  k.x += x.x * y.x, k.y += x.y * y.y, k.z += x.z * y.z, k.w += x.w * y.w;
  st[0] = m, st[d4] = t, st[2 * d4] = k;
}
static void floors(const char* tag, cudaStream_t s) {
  for (auto [name, rows, width, k] : {std::tuple{"md32x2048K3", 32, 2048, 3}, std::tuple{"md128x4096K3", 128, 4096, 3},
                                      std::tuple{"md64x8192K3", 64, 8192, 3}, std::tuple{"md128x4096K1", 128, 4096, 1}}) {
    FloorCopy a{};
    a.n4 = (int64_t)rows * width / 4, a.k = k;
    std::vector<int32_t> h(a.n4 * 4);
    for (auto& x : h) x = (int32_t)(rng() % 100000);
    a.src = reinterpret_cast<const int4*>(up(h));
    for (auto& d : a.dst) d = reinterpret_cast<int4*>(up(h));
    double best = 1e30; std::string shape;
    for (int block : {64, 128, 256})
      for (int unroll : {2, 4, 8}) {
        const double t = unroll == 2 ? floor_copy_us<2>(a, block, s) : unroll == 4 ? floor_copy_us<4>(a, block, s) : floor_copy_us<8>(a, block, s);
        if (t < best) best = t, shape = std::to_string(block) + "x" + std::to_string(unroll);
      }
    printf("%s floor %s %.3f %s\n", tag, name, best, shape.c_str());
    printf("%s floor %s/p0+0/128x2 %.3f\n", tag, name, floor_copy_us<2>(a, 128, s));
    printf("%s floor %s/p0+1600/128x2 %.3f\n", tag, name, floor_copy_us<2, 0, 1600>(a, 128, s));
    printf("%s floor %s/p800+0/128x2 %.3f\n", tag, name, floor_copy_us<2, 800, 0>(a, 128, s));
    printf("%s floor %s/p0+0/64x8 %.3f\n", tag, name, floor_copy_us<8>(a, 64, s));
    cudaFree((void*)a.src);
    for (auto d : a.dst) cudaFree(d);
  }
  for (int B : {1, 32, 256}) {
    const int d4 = D / 4;
    float4* kv = reinterpret_cast<float4*>(up(randv((size_t)B * 2 * D, -2, 2)));
    float4* ape = reinterpret_cast<float4*>(up(randv(128 * D, -1, 1)));
    float4* st = reinterpret_cast<float4*>(up(randv((size_t)B * 3 * D, -2, 2)));
    std::vector<int32_t> slots_h(B), lens_h(B);
    for (int b = 0; b < B; ++b) slots_h[b] = b, lens_h[b] = 1 + (int32_t)(rng() % 1000);
    int32_t *slots = up(slots_h), *lens = up(lens_h);
    printf("%s floor B=%d/1trip %.3f\n", tag, B, graph_us([&](cudaStream_t x) { floor_decode<false><<<B, d4, 0, x>>>(kv, ape, st, slots, lens); }, s));
    printf("%s floor B=%d/2trip %.3f\n", tag, B, graph_us([&](cudaStream_t x) { floor_decode<true><<<B, d4, 0, x>>>(kv, ape, st, slots, lens); }, s));
    cudaFree(kv); cudaFree(ape); cudaFree(st); cudaFree(slots); cudaFree(lens);
  }
}

int main(int argc, char** argv) {
  const char* tag = argv[1];
  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<float> ape_h = randv(128 * D, -1, 1); float* ape = up(ape_h);
  printf("%s empty %.3f\n", tag, graph_us([](cudaStream_t st) { dsa_empty_launch(0, st); }, s));
  printf("%s hostempty %.3f\n", tag, host_us([](cudaStream_t st) { dsa_empty_launch(0, st); }, s));
  printf("%s eagerempty %.3f\n", tag, eager_us([](cudaStream_t st) { dsa_empty_launch(0, st); }, s));
  auto bf16 = [](float x) { uint32_t u; std::memcpy(&u, &x, 4); return (uint16_t)(u >> 16); };
  auto widen = [](uint16_t b) { uint32_t u = (uint32_t)b << 16; float x; std::memcpy(&x, &u, 4); return x; };
  const bool prefill_bf16 = getenv("KB_BF16") != nullptr;  // prefill cases with bf16 state ("<case>bf16")
  // KB_DEVICE_PLAN=<tokens>: the plans in device memory, planned in graph mode for a bucket of that
  // many tokens (at least the case's), counts read by the kernels ("<case>dev").
  const int64_t device_plan_tokens = getenv("KB_DEVICE_PLAN") ? atoll(getenv("KB_DEVICE_PLAN")) : 0;
  std::ifstream f(argv[2]); std::string line;
  while (std::getline(f, line)) {
    std::istringstream ls(line); std::string name, e, p; std::getline(ls, name, '|'); std::getline(ls, e, '|'); std::getline(ls, p, '|');
    std::vector<int64_t> ext, seq; { std::istringstream a(e); int64_t x; while (a >> x) ext.push_back(x); }
    { std::istringstream a(p); int64_t x; size_t i = 0; while (a >> x) seq.push_back(ext[i++] + x); }
    const int64_t B = ext.size(); int64_t N = 0; for (auto x : ext) N += x;
    if (device_plan_tokens > 0) N = std::max(N, device_plan_tokens), name += "dev";  // the bucket
    const int64_t cap = dsa_c128_compress_capacity(N, B);
    std::vector<dsa_segment> comp(cap), wr(B); int64_t nc = 0, nw = 0;
    dsa_plan_params pp{}; pp.struct_size = sizeof pp; pp.batch_size = B; pp.num_tokens = N; pp.seq_lens = seq.data(); pp.extend_lens = ext.data();
    pp.compress = comp.data(); pp.write = wr.data(); pp.compress_capacity = cap; pp.write_capacity = B; pp.num_compress = &nc; pp.num_write = &nw;
    pp.graph_mode = device_plan_tokens > 0;
    if (dsa_c128_plan_prefill(&pp) != DSA_STATUS_OK) { printf("plan failed %s\n", dsa_last_error()); return 1; }
    std::vector<float> st_h = randv(B * 3 * D, -2, 2);
    for (int64_t b = 0; b < B; ++b) for (int d = 0; d < D; ++d) st_h[b * 3 * D + D + d] = 1 + 29 * std::fabs(st_h[b * 3 * D + D + d]) / 2;
    std::vector<float> kv_h = randv(N * 2 * D, -2, 2), out_h(N * D, NAN);
    std::vector<int32_t> idx_h(B); for (int64_t b = 0; b < B; ++b) idx_h[b] = (int32_t)b;
    std::vector<uint16_t> st16(prefill_bf16 ? st_h.size() : 0);
    for (size_t i = 0; i < st16.size(); ++i) st16[i] = bf16(st_h[i]);
    if (prefill_bf16) name += "bf16";
    float *kv = up(kv_h), *out = up(out_h); int32_t* idx = up(idx_h);
    void* st = prefill_bf16 ? (void*)up(st16) : (void*)up(st_h);
    dsa_c128_prefill_params q{}; q.struct_size = sizeof q; q.flags = DSA_FLAG_HOST_PLAN; q.device = 0; q.head_dim = D; q.num_slots = B; q.batch_size = B; q.num_tokens = N;
    q.state = st; q.kv_score = kv; q.out = out; q.ape = ape; q.indices = idx; q.compress = comp.data(); q.write = wr.data(); q.compress_capacity = nc; q.write_capacity = nw;
    q.state_dtype = prefill_bf16 ? DSA_STATE_BFLOAT16 : DSA_STATE_FLOAT32;
    std::vector<int64_t> counts_h = {nc, nw};
    dsa_segment *comp_d = nullptr, *wr_d = nullptr; int64_t* counts_d = nullptr;
    if (device_plan_tokens > 0) {
      comp_d = up(comp), wr_d = up(wr), counts_d = up(counts_h);
      q.flags = 0; q.compress = comp_d; q.write = wr_d; q.compress_capacity = cap; q.write_capacity = B; q.counts = counts_d;
    }
    if (dsa_c128_prefill(&q, s) != DSA_STATUS_OK) { printf("launch failed %s\n", dsa_last_error()); return 1; }
    CK(cudaStreamSynchronize(s));
    std::vector<float> st_g, out_g = down(out, N * D), st_c = st_h, out_c(N * D, NAN);
    std::vector<uint16_t> st16_g, st16_c = st16;
    if (prefill_bf16) {
      st16_g = down((uint16_t*)st, st16.size());
      for (size_t i = 0; i < st16_g.size(); ++i) st_g.push_back(widen(st16_g[i]));
    } else {
      st_g = down((float*)st, B * 3 * D);
    }
    dsa_c128_prefill_params h = q; h.device = DSA_DEVICE_HOST;
    if (device_plan_tokens > 0) h.compress = comp.data(), h.write = wr.data(), h.counts = counts_h.data();
    h.state = prefill_bf16 ? (void*)st16_c.data() : (void*)st_c.data(); h.kv_score = kv_h.data(); h.out = out_c.data(); h.ape = ape_h.data(); h.indices = idx_h.data();
    if (dsa_c128_prefill(&h, nullptr) != DSA_STATUS_OK) { printf("host failed %s\n", dsa_last_error()); return 1; }
    if (prefill_bf16) for (size_t i = 0; i < st_c.size(); ++i) st_c[i] = widen(st16_c[i]);
    double err = 0; int64_t bad = 0;
    auto cmp = [&](float a, float b) { if (std::isnan(a) != std::isnan(b)) { ++bad; return; } if (!std::isnan(a)) err = std::max(err, (double)std::fabs(a - b) / (1.0 + std::fabs(b))); };
    for (size_t i = 0; i < out_c.size(); ++i) cmp(out_g[i], out_c[i]);
    for (size_t i = 0; i < st_c.size(); ++i) cmp(st_g[i], st_c[i]);
    const double t = graph_us([&](cudaStream_t st_) { dsa_c128_prefill(&q, st_); }, s);
    printf("%s prefill %s %.3f err %.2e nanmismatch %lld\n", tag, name.c_str(), t, err, (long long)bad);
    printf("%s hostprefill %s %.3f\n", tag, name.c_str(), host_us([&](cudaStream_t st_) { dsa_c128_prefill(&q, st_); }, s));
    printf("%s eagerprefill %s %.3f\n", tag, name.c_str(), eager_us([&](cudaStream_t st_) { dsa_c128_prefill(&q, st_); }, s));
    cudaFree(st); cudaFree(kv); cudaFree(out); cudaFree(idx); cudaFree(comp_d); cudaFree(wr_d); cudaFree(counts_d);
  }
  if (getenv("KB_PREFILL_ONLY")) return 0;  // the prefill cases only
  struct MdCase { const char* name; int64_t bs, width, real_cols, meta; };
  for (MdCase mc : {MdCase{"md32x2048K3", 32, 2048, 0, 0}, MdCase{"md128x4096K3", 128, 4096, 0, 0}, MdCase{"md64x8192+gK3", 64, 8192, 128, 1024},
                    MdCase{"md1x128K3", 1, 128, 0, 0}, MdCase{"md32x2048K1", 32, 2048, 0, 0}, MdCase{"md256x32768K1", 256, 32768, 0, 0},
                    MdCase{"md32x2048K8", 32, 2048, 0, 0}, MdCase{"md128x4096K8", 128, 4096, 0, 0},
                    MdCase{"md128x4096K1", 128, 4096, 0, 0}, MdCase{"md64x8192+gK1", 64, 8192, 128, 1024},
                    MdCase{"md1x128K1", 1, 128, 0, 0}, MdCase{"md32x2048K2", 32, 2048, 0, 0},
                    MdCase{"md256x32768K3", 256, 32768, 0, 0}, MdCase{"md512x65536K1", 512, 65536, 0, 0},
                    MdCase{"md512x65536K3", 512, 65536, 0, 0}, MdCase{"md40x2048K3", 40, 2048, 0, 0},
                    MdCase{"md64x2048K3", 64, 2048, 0, 0}, MdCase{"md96x2048K3", 96, 2048, 0, 0},
                    MdCase{"md64x2048K2", 64, 2048, 0, 0}, MdCase{"md129x2048K3", 129, 2048, 0, 0},
                    MdCase{"md129x2048K1", 129, 2048, 0, 0}, MdCase{"md196x2048K3", 196, 2048, 0, 0}}) {
    const int K = atoi(strrchr(mc.name, 'K') + 1);
    const int64_t bs = mc.bs, W = mc.width, R = mc.real_cols, M = mc.meta;
    auto ri = [&](size_t n) { std::vector<int32_t> v(n); for (auto& x : v) x = (int32_t)(rng() % 100000); return up(v); };
    dsa_metadata_copy_params q{}; q.struct_size = sizeof q; q.device = 0; q.mode = DSA_MODE_DECODE; q.bs = bs; q.page_rows = bs; q.page_width = W;
    q.real_cols = R; q.metadata_size = M;
    q.src.cache_seqlens = ri(bs); q.src.cu_seqlens_k = ri(bs + 1); q.src.page_indices = ri(bs * W); q.src.dsa_cache_seqlens = ri(bs); q.src.dsa_cu_seqlens_k = ri(bs + 1);
    if (R) q.src.real_page_table = ri(bs * R);
    if (M) q.src.num_splits = ri(bs + 1), q.src.flashmla_metadata = ri(M);
    std::vector<dsa_metadata_destination> dd(K);
    const int64_t pad = getenv("MD_PAD") ? atoll(getenv("MD_PAD")) : 0;  // destination row padding (the bench pads 128)
    for (auto& d : dd) {
      d.cache_seqlens = ri(bs); d.cache_seqlens_len = bs; d.cu_seqlens_k = ri(bs + 1); d.cu_seqlens_k_len = bs + 1;
      d.page_table = ri(bs * (W + pad)); d.page_table_rows = bs; d.page_table_cols = W + pad; d.page_table_stride = W + pad;
      d.dsa_cache_seqlens = ri(bs); d.dsa_cache_seqlens_len = bs; d.dsa_cu_seqlens_k = ri(bs + 1); d.dsa_cu_seqlens_k_len = bs + 1;
      if (R) d.real_page_table = ri(bs * R), d.real_page_table_rows = bs, d.real_page_table_cols = R, d.real_page_table_stride = R;
      if (M) d.num_splits = ri(bs + 1), d.num_splits_len = bs + 1, d.flashmla_metadata = ri(M), d.flashmla_metadata_len = M;
    }
    q.num_destinations = K; q.destinations = dd.data();
    if (dsa_metadata_copy(&q, s) != DSA_STATUS_OK) { printf("md failed %s\n", dsa_last_error()); return 1; }
    CK(cudaStreamSynchronize(s));
    std::vector<int32_t> a = down(q.src.page_indices, bs * W), b(bs * W);
    CK(cudaMemcpy2D(b.data(), W * 4, dd[K - 1].page_table, (W + pad) * 4, W * 4, bs, cudaMemcpyDeviceToHost));
    printf("%s decode %s %.3f err %d\n", tag, mc.name, graph_us([&](cudaStream_t st_) { dsa_metadata_copy(&q, st_); }, s), (int)(a != b));
  }
  // Decode, fp32 state at B = 1 / 32 / 256 / 8192 and bf16 state at B = 8192 (P14); checked against
  // the host backend (bf16: state to one bf16 step).
  auto decode_case = [&](int64_t B, auto zero) {
    using S = decltype(zero);
    constexpr bool half = sizeof(S) == 2;
    std::vector<float> st_f = randv((B + 3) * 3 * D, -2, 2), kv_h = randv(B * 2 * D, -2, 2), out_h(B * D, NAN);
    for (int64_t b = 0; b < B + 3; ++b) for (int d = 0; d < D; ++d) st_f[b * 3 * D + D + d] = 1 + std::fabs(st_f[b * 3 * D + D + d]) * 10;
    std::vector<S> st_h(st_f.size());
    for (size_t i = 0; i < st_f.size(); ++i) { if constexpr (half) st_h[i] = bf16(st_f[i]); else st_h[i] = st_f[i]; }
    std::vector<int32_t> idx_h(B), len_h(B); std::uniform_int_distribution<int> u(1, 1000);
    for (int64_t b = 0; b < B; ++b) idx_h[b] = (int32_t)b, len_h[b] = u(rng);
    S* st = up(st_h); float *kv = up(kv_h), *out = up(out_h); int32_t *idx = up(idx_h), *len = up(len_h);
    dsa_c128_decode_params q{}; q.struct_size = sizeof q; q.device = 0; q.head_dim = D; q.num_slots = B + 3; q.batch_size = B;
    q.state = st; q.kv_score = kv; q.out = out; q.ape = ape; q.indices = idx; q.seq_lens = len;
    q.state_dtype = half ? DSA_STATE_BFLOAT16 : DSA_STATE_FLOAT32;
    dsa_c128_decode(&q, s); CK(cudaStreamSynchronize(s));
    std::vector<S> st_g = down(st, st_h.size()); std::vector<float> out_g = down(out, out_h.size());
    dsa_c128_decode_params h = q; h.device = DSA_DEVICE_HOST; std::vector<S> st_c = st_h; std::vector<float> out_c = out_h;
    h.state = st_c.data(); h.kv_score = kv_h.data(); h.out = out_c.data(); h.ape = ape_h.data(); h.indices = idx_h.data(); h.seq_lens = len_h.data();
    dsa_c128_decode(&h, nullptr);
    auto value = [&](S x) { if constexpr (half) return widen(x); else return x; };
    double err = 0;
    for (size_t i = 0; i < st_c.size(); ++i) err = std::max(err, (double)std::fabs(value(st_g[i]) - value(st_c[i])) / (1.0 + std::fabs(value(st_c[i]))));
    for (size_t i = 0; i < out_c.size(); ++i) if (!half && !std::isnan(out_c[i])) err = std::max(err, (double)std::fabs(out_g[i] - out_c[i]) / (1.0 + std::fabs(out_c[i])));
    printf("%s decode B=%lld%s %.3f %s %.2e\n", tag, (long long)B, half ? "bf16" : "", graph_us([&](cudaStream_t st_) { dsa_c128_decode(&q, st_); }, s),
           half ? "bf16err" : "err", err);
    cudaFree(st); cudaFree(kv); cudaFree(out); cudaFree(idx); cudaFree(len);
  };
  for (int64_t B : {1, 32, 256, 8192}) decode_case(B, 0.0f);
  decode_case(8192, uint16_t{0});
  floors(tag, s);
  return 0;
}
