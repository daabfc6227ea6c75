// c128 decode (docs/spec.md, "Decode"): the kernel, its launch and the entry point.
#include "c128_checks.h"
#include "c128_host.h"
#include "device.cuh"
#include "store.cuh"

DSA_DECLARE_STRUCT(DSA_STRUCT_DECODE_PARAMS, dsa_c128_decode_params);

namespace dsa {
namespace {

// The head size the storing decode is also compiled for with D a constant (DeepSeek-V4's compressed
// KV): its address arithmetic and the store's group sums fold; other sizes read D from the launch.
constexpr int kCompiledHeadDim = 512;

// ---------------------------------------------------------------------------------------------
// Decode: one request per block row (threadIdx.y), D / VEC threads across its channels, in
// column tiles of at most 128 threads (blockIdx.y) for wide heads. Two dependent memory round
// trips: the token with the request's length and slot, then its ape row and the slot's state.

// The decode kernel's parameters, ordered by first use: what a block needs up to its second loads
// (head size, request count, the token, length, slot, state and ape pointers) in the first 48
// bytes, one constant line (docs/performance.md, "c128 decode"); what it reads at its second loads
// (the slot count, whether to let the next kernel start early) in the next.
struct DecodeLaunch {
  uint32_t head_dim;
  uint32_t batch_size;  // <= INT32_MAX (host check)
  const float* kv_score;
  const int32_t* seq_lens;  // kRecords: the records
  const int32_t* indices;
  void* state;
  const float* ape;
  uint32_t slot_count;        // num_slots (<= INT32_MAX host check), for slot_ok
  uint32_t early_dependents;  // nonzero: the next kernel may launch once this one's first loads are issued
  float* out;
  uint32_t* error_count;
  const int32_t* load_indices;  // kLoad only
  StoreLaunch store;            // kStore only
};

// Where a request's length, slot and load slot come from: three int32 arrays (kPacked: the state
// is read from `indices`; kLoad: from load_indices), or one 16-byte record per request
// {seq_len, slot, load slot, unused} read in one access (kRecords, DSA_FLAG_DECODE_RECORDS).
enum RowSource { kPacked, kLoad, kRecords };

// kRows: a RowSource (a template parameter rather than a branch on a pointer: a parameter past the
// first constant line read at run time cost every decode). kStore: a closed vector is also stored
// into the cache (store.cuh); `out` may then be null.
// kD: the head size as a constant (kCompiledHeadDim), or 0 to read it from the launch.
template <int VEC, typename S, int kRows, bool kStore, int kD>
__global__ void __launch_bounds__(kStore ? kStoringDecodeMaxThreads : kDecodeThreads)
    c128_decode_kernel(const __grid_constant__ DecodeLaunch p) {
  constexpr bool kLoadSlots = kRows != kPacked;
  const uint32_t D = kD != 0 ? (uint32_t)kD : p.head_dim;
  // 32-bit request index and channel (batch_size <= INT32_MAX, head_dim < 2^27: host checks);
  // offsets are unsigned 64-bit products, one wide multiply-add each.
  const uint32_t b = blockIdx.x * blockDim.y + threadIdx.y;
  const uint32_t ch = (blockIdx.y * blockDim.x + threadIdx.x) * VEC;
  if (b >= p.batch_size || ch >= D || (kStore && !store_params_ready(p.store))) return;
  wait_for_producers();
  const float* token = p.kv_score + ((uint64_t)b * (2 * D) + ch);
  const Lanes<VEC> kv = load_lanes<VEC>(token), score = load_lanes<VEC>(token + D);
  int32_t seq_len, slot, load_slot;
  if constexpr (kRows == kRecords) {
    const int4 r = __ldg(reinterpret_cast<const int4*>(p.seq_lens) + b);
    seq_len = r.x, slot = r.y, load_slot = r.z;
  } else {
    seq_len = __ldg(p.seq_lens + b), slot = __ldg(p.indices + b);
    load_slot = kLoadSlots ? __ldg(p.load_indices + b) : slot;
  }
  const int64_t loc = kStore ? __ldg(p.store.cache_slots + b) : 0;
  [[maybe_unused]] StoreOperands<VEC> o;
  if constexpr (kStore) load_weights<VEC>(o, p.store, ch);
  // Early for small grids, where the next kernel's launch latency is what a step waits on; a grid
  // that fills the GPU lets it start as its blocks finish (docs/performance.md, "c128 decode").
  if (p.early_dependents) allow_dependents();
  if (seq_len <= 0) return;  // padding row of a CUDA-graph batch
  const int c = (seq_len - 1) & (DSA_CHUNK - 1);  // seq_len >= 1
  if (slot < 0 || (kLoadSlots && c != 0 && load_slot < 0)) return;  // not held on this GPU: skipped, uncounted
  if (!slot_ok(slot, p.slot_count) || (kLoadSlots && c != 0 && !slot_ok(load_slot, p.slot_count))) {
    if (ch == 0) count_error(p.error_count);
    return;
  }
  // The second trip: a closing row's rotary pairs (rope lanes only, one predicated load), the ape row
  // and the state. A chunk's first token reads its own slot's state and ignores it, so none of these
  // loads sits in a branch: around them, branches let the compiler put dependent arithmetic ahead of
  // later loads (docs/performance.md, "c128 decode": 0.2-0.35 us off a storing decode's closing row).
  if constexpr (kStore) load_rotary<VEC>(o, p.store, D, ch, seq_len - DSA_CHUNK, c == DSA_CHUNK - 1);
  S* state = static_cast<S*>(p.state) + ((uint64_t)(uint32_t)slot * (3 * D) + ch);
  const S* prior = static_cast<const S*>(p.state) + ((uint64_t)(uint32_t)(c != 0 ? load_slot : slot) * (3 * D) + ch);
  const Lanes<VEC> bias = load_lanes<VEC>(p.ape + ((uint32_t)c * D + ch));
  Lanes<VEC> m = load_state<VEC>(prior), s = load_state<VEC>(prior + D), k = load_state<VEC>(prior + 2 * D);
  if constexpr (kStore) {
    if (c == DSA_CHUNK - 1) aim_store<VEC>(o, p.store, loc, seq_len - DSA_CHUNK, D);
  }
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    const Partial r = token_into_state(m.v[i], s.v[i], k.v[i], to_log2(score.v[i] + bias.v[i]), kv.v[i], c);
    m.v[i] = state_max(r), s.v[i] = r.sum, k.v[i] = mean_of(r);
  }
  if (c == DSA_CHUNK - 1) {
    if (!kStore || p.out != nullptr) store_lanes<VEC>(p.out + ((uint64_t)b * D + ch), k);
    if constexpr (kStore)
      store_vector<VEC>(p.store, k.v, o, (int)D, (int)ch, (int)blockDim.x, p.error_count);
  } else {
    store_state<VEC>(state, m);
    store_state<VEC>(state + D, s);
    store_state<VEC>(state + 2 * D, k);
  }
}

// ---------------------------------------------------------------------------------------------
// Device launches.

template <int kRows, bool kStore, int kD>
cudaError_t launch_decode(int vec, bool bf16, dim3 grid, dim3 block, cudaStream_t s, unsigned mode, const DecodeLaunch& a) {
  if constexpr (!kStore) {
    if (vec == 8) return launch(c128_decode_kernel<8, Bf16, kRows, false, kD>, grid, block, s, mode, a);
  }
  return vec == 4 ? (bf16 ? launch(c128_decode_kernel<4, Bf16, kRows, kStore, kD>, grid, block, s, mode, a)
                          : launch(c128_decode_kernel<4, float, kRows, kStore, kD>, grid, block, s, mode, a))
                  : (bf16 ? launch(c128_decode_kernel<2, Bf16, kRows, kStore, kD>, grid, block, s, mode, a)
                          : launch(c128_decode_kernel<2, float, kRows, kStore, kD>, grid, block, s, mode, a));
}

template <bool kStore, int kD>
cudaError_t launch_decode(int rows, int vec, bool bf16, dim3 grid, dim3 block, cudaStream_t s, unsigned mode,
                          const DecodeLaunch& a) {
  return rows == kRecords ? launch_decode<kRecords, kStore, kD>(vec, bf16, grid, block, s, mode, a)
         : rows == kLoad  ? launch_decode<kLoad, kStore, kD>(vec, bf16, grid, block, s, mode, a)
                          : launch_decode<kPacked, kStore, kD>(vec, bf16, grid, block, s, mode, a);
}

// The storing decode at D = kCompiledHeadDim runs with D a constant (closing rows 0.02-0.15 us
// faster); the plain decode keeps D from the launch, where the constant made it slower at B = 256
// (docs/performance.md, "c128 decode").
template <bool kStore>
cudaError_t launch_decode(int head_dim, int rows, int vec, bool bf16, dim3 grid, dim3 block, cudaStream_t s,
                          unsigned mode, const DecodeLaunch& a) {
  if constexpr (kStore) {
    if (head_dim == kCompiledHeadDim) return launch_decode<kStore, kCompiledHeadDim>(rows, vec, bf16, grid, block, s, mode, a);
  }
  return launch_decode<kStore, 0>(rows, vec, bf16, grid, block, s, mode, a);
}

struct DecodeChecked {
  bool nothing = false;
  StoreLaunch store = {};
};

dsa_status check_decode(const dsa_c128_decode_params& p, const char* op, DecodeChecked* c) {
  if (p.batch_size < 0)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: batch_size is %lld; expected >= 0", op, (long long)p.batch_size);
  if (p.batch_size == 0) return c->nothing = true, DSA_STATUS_OK;
  DSA_TRY(check_common(p, op));
  const bool records = (p.flags & DSA_FLAG_DECODE_RECORDS) != 0;
  if (records ? (p.seq_lens != nullptr || p.load_indices != nullptr) : p.seq_lens == nullptr)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: %s", op,
                records ? "with DSA_FLAG_DECODE_RECORDS the records are `indices`; seq_lens and load_indices must be null"
                        : "seq_lens must be non-null");
  if (p.out == nullptr && p.store == nullptr)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: out must be non-null unless there is a store", op);
  if (p.store != nullptr) DSA_TRY(store_launch(p.store, p.cache_slots, p.head_dim, p.device, op, &c->store));
  return DSA_STATUS_OK;
}

dsa_status decode_device(const dsa_c128_decode_params& p, const DecodeChecked& c, int sms, cudaStream_t s,
                         const char* op) {
  const bool records = (p.flags & DSA_FLAG_DECODE_RECORDS) != 0;
  if (records && !aligned(p.indices, 16))
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: decode records must be 16-byte aligned on the GPU", op);
  const DecodeShape shape = decode_shape(p, sms);
  if (!shape.store_ok)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: a storing decode on the GPU needs 16-byte aligned buffers and "
                "head_dim <= %d (got %d)", op, 4 * kDecodeThreads, p.head_dim);
  if (!shape.fits) return too_large(op);
  DecodeLaunch a = {};
  a.head_dim = (uint32_t)p.head_dim, a.batch_size = (uint32_t)p.batch_size;
  a.slot_count = (uint32_t)p.num_slots;  // 1..INT32_MAX (check_common)
  a.early_dependents = shape.early_dependents;
  a.kv_score = p.kv_score, a.seq_lens = records ? p.indices : p.seq_lens, a.indices = p.indices;
  a.state = p.state, a.ape = p.ape, a.out = p.out, a.error_count = p.error_count;
  a.load_indices = p.load_indices, a.store = c.store;
  const int rows = records ? kRecords : p.load_indices != nullptr ? kLoad : kPacked;
  const bool bf16 = p.state_dtype == DSA_STATE_BFLOAT16;
  const unsigned mode = (p.flags & DSA_FLAG_PDL) ? kLaunchPdl : 0u;
  const dim3 grid = grid_of(shape.shape), block = block_of(shape.shape);
  const cudaError_t err =
      p.store != nullptr ? launch_decode<true>(p.head_dim, rows, shape.vec, bf16, grid, block, s, mode, a)
                         : launch_decode<false>(p.head_dim, rows, shape.vec, bf16, grid, block, s, mode, a);
  return launch_status(err, op);
}

}  // namespace
}  // namespace dsa

extern "C" dsa_status dsa_c128_decode(const dsa_c128_decode_params* params, void* stream) {
  using namespace dsa;
  return dispatch<DecodeChecked>(params, stream, "dsa_c128_decode", check_decode,
                                 host_decode,
                                 decode_device);
}
