// Speculative decoding (docs/spec.md, "Speculative decoding"): verify and commit kernels, their
// launches and entry points.
#include "c128_checks.h"
#include "device.cuh"
#include "c128_host.h"
#include "store.cuh"

DSA_DECLARE_STRUCT(DSA_STRUCT_VERIFY_PARAMS, dsa_c128_verify_params);
DSA_DECLARE_STRUCT(DSA_STRUCT_COMMIT_PARAMS, dsa_c128_commit_params);

namespace dsa {
namespace {

// ---------------------------------------------------------------------------------------------
// Verify (docs/spec.md, speculative decoding): the decode's geometry, and its arithmetic run over a request's drafts in order,
// so a verified token leaves exactly the state a decoded one would. Two dependent memory trips, as
// in the decode: the first kDraftBatch drafts with the request's length and slots, then the ape
// rows and the loaded state; later batches of drafts load as the first is folded in.

// Parameters in first-use order, as DecodeLaunch.
struct VerifyLaunch {
  int32_t head_dim;
  uint32_t batch_size;  // <= INT32_MAX (host check)
  const float* kv_score;
  const int32_t* seq_lens;
  const int32_t* indices;
  const int32_t* bank_indices;
  const int32_t* verify_lens;  // null: num_drafts
  void* state;
  const float* ape;
  int64_t bank_stride;
  int64_t num_slots;
  float* out;  // null: no vectors written
  uint32_t* error_count;
  int32_t num_drafts;
  uint32_t fp32_between_drafts;  // DSA_FLAG_VERIFY_FP32_BETWEEN_DRAFTS: no rounding of the running state
  StoreLaunch store;  // kStore only
};

template <int VEC, int NB>
__device__ __forceinline__ void load_drafts(Lanes<VEC> (&kv)[NB], Lanes<VEC> (&score)[NB], const float* draft, int D,
                                            int count) {
#pragma unroll
  for (int u = 0; u < NB; ++u)
    if (u < count) kv[u] = load_lanes<VEC>(draft + (int64_t)u * 2 * D), score[u] = load_lanes<VEC>(draft + (int64_t)u * 2 * D + D);
}

// The ape rows of drafts at positions seq .. seq + count - 1 (their chunk positions).
template <int VEC, int NB>
__device__ __forceinline__ void load_biases(Lanes<VEC> (&bias)[NB], const float* ape, int32_t seq, int count, int D,
                                            int ch) {
#pragma unroll
  for (int u = 0; u < NB; ++u)
    if (u < count) bias[u] = load_lanes<VEC>(ape + ((int64_t)((seq + u) & (DSA_CHUNK - 1)) * D + ch));
}

// kStore: the vector a draft closes is also stored into the cache (store.cuh), with the threads of
// a request in one block (up to kVerifyStoreMaxThreads).
template <int VEC, typename S, int kDraftBatch, bool kStore>
__global__ void __launch_bounds__(kStore ? kVerifyStoreMaxThreads : kDecodeThreads)
    c128_verify_kernel(const __grid_constant__ VerifyLaunch p) {
  const int D = p.head_dim, V = p.num_drafts;
  const uint32_t b = blockIdx.x * blockDim.y + threadIdx.y;
  const int ch = (int)(blockIdx.y * blockDim.x + threadIdx.x) * VEC;
  if (b >= p.batch_size || ch >= D || (kStore && !store_params_ready(p.store))) return;
  wait_for_producers();
  const float* drafts = p.kv_score + ((int64_t)b * V * (2 * D) + ch);
  Lanes<VEC> kv[kDraftBatch], score[kDraftBatch];
  load_drafts<VEC, kDraftBatch>(kv, score, drafts, D, min(V, kDraftBatch));  // rows b*V .. b*V+V exist whatever v is
  const int32_t seq = __ldg(p.seq_lens + b);
  const int32_t load_slot = __ldg(p.indices + b);
  const int32_t bank = __ldg(p.bank_indices + b);
  const int32_t v = p.verify_lens != nullptr ? __ldg(p.verify_lens + b) : V;
  allow_dependents();
  if (seq < 0) return;  // padding row
  const int c0 = seq & (DSA_CHUNK - 1);
  if (bank < 0 || (c0 != 0 && load_slot < 0)) return;  // not held on this GPU
  if ((uint32_t)v > (uint32_t)V || (c0 != 0 && load_slot >= p.num_slots) ||
      bank + (int64_t)v * p.bank_stride >= p.num_slots) {
    if (ch == 0) count_error(p.error_count);
    return;
  }
  // The draft that closes the request's chunk, if any (V < 128: at most one): its cache slot and the
  // norm weights load beside the state.
  const int close = DSA_CHUNK - 1 - c0;
  [[maybe_unused]] StoreOperands<VEC> o;
  [[maybe_unused]] int64_t loc = 0;
  if constexpr (kStore) {
    if (close < v) {
      loc = __ldg(p.store.cache_slots + ((int64_t)b * V + close));
      load_weights<VEC>(o, p.store, ch);
      load_rotary<VEC>(o, p.store, D, ch, (int64_t)seq + close - (DSA_CHUNK - 1));
    }
  }
  // The first drafts' ape rows load with the state, not after it: behind the state's copy into the
  // bank they were one more memory trip (docs/performance.md, "Speculative verify and commit").
  Lanes<VEC> bias[kDraftBatch];
  load_biases<VEC, kDraftBatch>(bias, p.ape, seq, min(v, kDraftBatch), D, ch);
  S* const state = static_cast<S*>(p.state);
  const int64_t entry_step = p.bank_stride * 3 * D;
  S* entry = state + (int64_t)bank * 3 * D + ch;  // bank entry 0, then one entry per draft
  Lanes<VEC> m, s, k;
  if (c0 != 0) {
    const S* prior = state + (int64_t)load_slot * 3 * D + ch;
    m = load_state<VEC>(prior), s = load_state<VEC>(prior + D), k = load_state<VEC>(prior + 2 * D);
  }
  // The closing draft's slot resolved while the state is in flight (its loc was read with the weights).
  if constexpr (kStore) {
    if (close < v) aim_store<VEC>(o, p.store, loc, (int64_t)seq + close - (DSA_CHUNK - 1), D);
  }
  if (c0 != 0 && bank != load_slot) {
    store_state<VEC>(entry, m), store_state<VEC>(entry + D, s), store_state<VEC>(entry + 2 * D, k);
  }
  for (int j0 = 0; j0 < v; j0 += kDraftBatch) {
    const int count = min(v - j0, kDraftBatch);
    if (j0 > 0) {
      load_drafts<VEC, kDraftBatch>(kv, score, drafts + (int64_t)j0 * 2 * D, D, count);
      load_biases<VEC, kDraftBatch>(bias, p.ape, seq + j0, count, D, ch);
    }
#pragma unroll
    for (int u = 0; u < kDraftBatch; ++u) {
      if (u >= count) break;
      const int j = j0 + u, c = (seq + j) & (DSA_CHUNK - 1);
      entry += entry_step;
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const Partial r = token_into_state(m.v[i], s.v[i], k.v[i], to_log2(score[u].v[i] + bias[u].v[i]), kv[u].v[i], c);
        m.v[i] = state_max(r), s.v[i] = r.sum, k.v[i] = mean_of(r);
        if (!p.fp32_between_drafts) m.v[i] = as_stored<S>(m.v[i]), s.v[i] = as_stored<S>(s.v[i]);
      }
      if (c == DSA_CHUNK - 1) {  // the draft closes its chunk; the next one starts fresh
        if (p.out != nullptr) store_lanes<VEC>(p.out + (((int64_t)b * V + j) * D + ch), k);
        if constexpr (kStore)
          store_vector<VEC>(p.store, k.v, o, D, ch, (int)blockDim.x, p.error_count);
      } else {
        store_state<VEC>(entry, m), store_state<VEC>(entry + D, s), store_state<VEC>(entry + 2 * D, k);
        if (!p.fp32_between_drafts) {
#pragma unroll
          for (int i = 0; i < VEC; ++i) k.v[i] = as_stored<S>(k.v[i]);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Commit (docs/spec.md, speculative decoding): the accepted prefix's slot written into load_indices (one thread per
// request, for every layer at once), or the accepted bank entry copied onto the verify's source
// slot in every listed layer (the decode's geometry, one layer per blockIdx.z).

struct CommitLaunch {
  int32_t head_dim;
  uint32_t batch_size;
  const int32_t* seq_lens;
  const int32_t* accepted;
  const int32_t* verify_lens;  // null: num_drafts
  const int32_t* indices;
  const int32_t* bank_indices;
  int64_t bank_stride;
  int64_t num_slots;
  int32_t* load_indices;
  uint32_t* error_count;
  int32_t num_drafts;
  int32_t first_layer;  // 0 in the launch that counts errors
};

template <int kLayers>
struct CommitStates {
  void* s[kLayers];
};


__global__ void __launch_bounds__(kCommitThreads) c128_commit_slots_kernel(const __grid_constant__ CommitLaunch p) {
  const uint32_t b = blockIdx.x * kCommitThreads + threadIdx.x;
  if (b >= p.batch_size) return;
  wait_for_producers();
  const int32_t seq = __ldg(p.seq_lens + b), accepted = __ldg(p.accepted + b);
  const int32_t v = p.verify_lens != nullptr ? __ldg(p.verify_lens + b) : p.num_drafts;
  const int32_t load = __ldg(p.indices + b), bank = __ldg(p.bank_indices + b);
  allow_dependents();
  if (seq < 0) return;
  if ((uint32_t)v > (uint32_t)p.num_drafts) {
    count_error(p.error_count);
    return;
  }
  int64_t slot = accepted_slot(seq, accepted, v, load, bank, p.bank_stride);
  if (slot >= p.num_slots) {
    count_error(p.error_count);
    slot = -1;
  }
  p.load_indices[b] = (int32_t)slot;
}

template <int VEC, typename S>
__global__ void __launch_bounds__(kDecodeThreads)
    c128_commit_copy_kernel(const __grid_constant__ CommitLaunch p, const __grid_constant__ CommitStates<DSA_COMMIT_LAYERS> states) {
  const int D = p.head_dim;
  const uint32_t b = blockIdx.x * blockDim.y + threadIdx.y;
  const int ch = (int)(blockIdx.y * blockDim.x + threadIdx.x) * VEC;
  if (b >= p.batch_size || ch >= D) return;
  wait_for_producers();
  const int32_t seq = __ldg(p.seq_lens + b), accepted = __ldg(p.accepted + b);
  const int32_t v = p.verify_lens != nullptr ? __ldg(p.verify_lens + b) : p.num_drafts;
  const int32_t main = __ldg(p.indices + b), bank = __ldg(p.bank_indices + b);
  allow_dependents();
  const bool report = ch == 0 && blockIdx.z == 0 && p.first_layer == 0;
  if (seq < 0) return;
  if ((uint32_t)v > (uint32_t)p.num_drafts) {
    if (report) count_error(p.error_count);
    return;
  }
  const int32_t a = min(max(accepted, 0), v);
  if (a == 0 || ((int64_t)seq + a) % DSA_CHUNK == 0 || main < 0 || bank < 0) return;
  const int64_t from = bank + a * p.bank_stride;
  if (main >= p.num_slots || from >= p.num_slots) {
    if (report) count_error(p.error_count);
    return;
  }
  S* const state = static_cast<S*>(states.s[blockIdx.z]);
  const Pack<S, VEC>* src = reinterpret_cast<const Pack<S, VEC>*>(state + from * 3 * D + ch);
  Pack<S, VEC>* dst = reinterpret_cast<Pack<S, VEC>*>(state + (int64_t)main * 3 * D + ch);
  const int step = D / VEC;
  const Pack<S, VEC> x0 = src[0], x1 = src[step], x2 = src[2 * step];
  dst[0] = x0, dst[step] = x1, dst[2 * step] = x2;
}

struct VerifyChecked {
  bool nothing = false;
  StoreLaunch store = {};
};

dsa_status check_verify(const dsa_c128_verify_params& p, const char* op, VerifyChecked* c) {
  if (p.batch_size < 0)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: batch_size is %lld; expected >= 0", op, (long long)p.batch_size);
  DSA_TRY(check_speculative(p, op));
  if (p.batch_size == 0) return c->nothing = true, DSA_STATUS_OK;
  DSA_TRY(check_common(p, op));
  if (p.store != nullptr) DSA_TRY(store_launch(p.store, p.cache_slots, p.head_dim, p.device, op, &c->store));
  return DSA_STATUS_OK;
}

// The verify kernel of VEC channels per thread, state element S, storing or not, with its draft batch.
template <int VEC, typename S, bool kStore>
cudaError_t launch_verify(dim3 grid, dim3 block, cudaStream_t s, unsigned mode, const VerifyLaunch& a) {
  return launch(c128_verify_kernel<VEC, S, verify_draft_batch(VEC, kStore), kStore>, grid, block, s, mode, a);
}

dsa_status verify_device(const dsa_c128_verify_params& p, const VerifyChecked& c, int, cudaStream_t s,
                         const char* op) {
  const VerifyShape shape = verify_shape(p);
  if (!shape.store_ok)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: a storing verify on the GPU needs 8-byte aligned buffers and "
                "head_dim <= 1024 (got %d)", op, p.head_dim);
  if (!shape.fits) return too_large(op);
  VerifyLaunch a = {};
  a.head_dim = p.head_dim, a.batch_size = (uint32_t)p.batch_size, a.num_drafts = p.num_drafts;
  a.kv_score = p.kv_score, a.seq_lens = p.seq_lens, a.indices = p.indices, a.bank_indices = p.bank_indices;
  a.verify_lens = p.verify_lens, a.state = p.state, a.ape = p.ape, a.bank_stride = p.bank_stride;
  a.num_slots = p.num_slots, a.out = p.out, a.error_count = p.error_count, a.store = c.store;
  a.fp32_between_drafts = (p.flags & DSA_FLAG_VERIFY_FP32_BETWEEN_DRAFTS) != 0;
  const unsigned mode = (p.flags & DSA_FLAG_PDL) ? kLaunchPdl : 0u;
  const bool bf16 = p.state_dtype == DSA_STATE_BFLOAT16;
  const int vec = shape.vec;
  const dim3 grid = grid_of(shape.shape), block = block_of(shape.shape);
  const cudaError_t err =
      p.store != nullptr
          ? (vec == 4 ? (bf16 ? launch_verify<4, Bf16, true>(grid, block, s, mode, a)
                              : launch_verify<4, float, true>(grid, block, s, mode, a))
                      : (bf16 ? launch_verify<2, Bf16, true>(grid, block, s, mode, a)
                              : launch_verify<2, float, true>(grid, block, s, mode, a)))
      : vec == 1 ? (bf16 ? launch_verify<1, Bf16, false>(grid, block, s, mode, a)
                         : launch_verify<1, float, false>(grid, block, s, mode, a))
      : vec == 4 ? launch_verify<4, Bf16, false>(grid, block, s, mode, a)
                 : (bf16 ? launch_verify<2, Bf16, false>(grid, block, s, mode, a)
                         : launch_verify<2, float, false>(grid, block, s, mode, a));
  return launch_status(err, op);
}

struct CommitChecked {
  bool nothing = false;
};

dsa_status check_commit(const dsa_c128_commit_params& p, const char* op, CommitChecked* c) {
  if (p.batch_size < 0)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: batch_size is %lld; expected >= 0", op, (long long)p.batch_size);
  DSA_TRY(check_speculative(p, op));
  if (p.num_slots <= 0 || p.num_slots > INT32_MAX)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: num_slots is %lld; expected 1..%d", op, (long long)p.num_slots,
                INT32_MAX);
  if (p.batch_size > 0 && (p.accepted == nullptr || p.indices == nullptr))
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: accepted and indices must be non-null", op);
  const bool copying = p.num_layers != 0;
  if (p.num_layers < 0 || (copying == (p.load_indices != nullptr) && p.batch_size > 0))
    return fail(DSA_STATUS_INVALID_ARGUMENT,
                "%s: give either load_indices (num_layers 0) or num_layers >= 1 state buffers (got load_indices %s, "
                "num_layers %d)", op, p.load_indices != nullptr ? "set" : "null", p.num_layers);
  const int sb = p.state_dtype == DSA_STATE_BFLOAT16 ? 2 : 4;
  if (copying) {
    DSA_TRY(check_state_layout(p.head_dim, p.state_dtype, op));
    if (p.states == nullptr) return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: states is null with num_layers %d", op, p.num_layers);
    for (int32_t i = 0; i < p.num_layers; ++i)
      if (p.states[i] == nullptr || !aligned(p.states[i], 2 * sb))
        return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: states[%d] is null or not %d-byte aligned", op, i, 2 * sb);
  }
  c->nothing = p.batch_size == 0;
  return DSA_STATUS_OK;
}

dsa_status commit_device(const dsa_c128_commit_params& p, const CommitChecked&, int, cudaStream_t s, const char* op) {
  CommitLaunch a = {};
  a.head_dim = p.head_dim, a.batch_size = (uint32_t)p.batch_size, a.num_drafts = p.num_drafts;
  a.seq_lens = p.seq_lens, a.accepted = p.accepted, a.verify_lens = p.verify_lens, a.indices = p.indices;
  a.bank_indices = p.bank_indices, a.bank_stride = p.bank_stride, a.num_slots = p.num_slots;
  a.load_indices = p.load_indices, a.error_count = p.error_count;
  const unsigned mode = (p.flags & DSA_FLAG_PDL) ? kLaunchPdl : 0u;
  if (p.num_layers == 0) {
    const unsigned blocks = (unsigned)commit_slots_blocks(p.batch_size);  // the grid: launch_policy.h
    return launch_status(launch(c128_commit_slots_kernel, blocks, kCommitThreads, s, mode, a), op);
  }
  const int vec = commit_copy_vector_width(p);
  const bool bf16 = p.state_dtype == DSA_STATE_BFLOAT16;
  for (int32_t first = 0; first < p.num_layers; first += DSA_COMMIT_LAYERS) {
    const int layers = std::min<int32_t>(DSA_COMMIT_LAYERS, p.num_layers - first);
    const Shape shape = request_grid(p.head_dim, vec, p.batch_size, layers);
    if (!shape.fits) return too_large(op);
    const dim3 grid = grid_of(shape), block = block_of(shape);
    CommitStates<DSA_COMMIT_LAYERS> states = {};
    for (int i = 0; i < layers; ++i) states.s[i] = p.states[first + i];
    a.first_layer = first;
    const cudaError_t err = vec == 4 ? (bf16 ? launch(c128_commit_copy_kernel<4, Bf16>, grid, block, s, mode, a, states)
                                             : launch(c128_commit_copy_kernel<4, float>, grid, block, s, mode, a, states))
                                     : (bf16 ? launch(c128_commit_copy_kernel<2, Bf16>, grid, block, s, mode, a, states)
                                             : launch(c128_commit_copy_kernel<2, float>, grid, block, s, mode, a, states));
    DSA_TRY(launch_status(err, op));
  }
  return DSA_STATUS_OK;
}

}  // namespace
}  // namespace dsa

extern "C" dsa_status dsa_c128_verify(const dsa_c128_verify_params* params, void* stream) {
  using namespace dsa;
  return dispatch<VerifyChecked>(params, stream, "dsa_c128_verify", check_verify,
                                 host_verify,
                                 verify_device);
}

extern "C" dsa_status dsa_c128_commit(const dsa_c128_commit_params* params, void* stream) {
  using namespace dsa;
  return dispatch<CommitChecked>(params, stream, "dsa_c128_commit", check_commit,
                                 host_commit,
                                 commit_device);
}
