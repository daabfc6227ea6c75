// The standalone KV-cache store (docs/spec.md, "The store"): vectors and slots in, cache entries out;
// and the check of a dsa_kv_cache that every storing op shares.
#include <algorithm>

#include "c128_math.h"  // the c128 prefill's segment records, whose vectors store_prefill_vectors stores
#include "inline_records.cuh"
#include "store.cuh"
#include "store_host.h"

DSA_DECLARE_STRUCT(DSA_STRUCT_KV_CACHE, dsa_kv_cache);
DSA_DECLARE_STRUCT(DSA_STRUCT_KV_STORE_PARAMS, dsa_kv_store_params);

namespace dsa {

dsa_status store_launch(const dsa_kv_cache* c, const int64_t* cache_slots, int head_dim, int device,
                        const char* op, StoreLaunch* out, int32_t layout, const char* name) {
  DSA_TRY(check_struct(c, op));
  if (c->layout != layout)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: %s.layout is %d; expected %d (%s)", op, name, c->layout, layout,
                layout == DSA_CACHE_V4 ? "DSA_CACHE_V4" : "DSA_CACHE_INDEXER");
  if (layout == DSA_CACHE_INDEXER ? head_dim != kIndexerDim
                                  : (head_dim < 2 * kStoreGroup || head_dim % kStoreGroup != 0 ||
                                     head_dim / kStoreGroup > kStoreMaxGroups))
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: head_dim is %d; %s needs %s", op, head_dim, name,
                layout == DSA_CACHE_INDEXER ? "128 (an indexer cache)" : "a multiple of 64 in 128..4096");
  const int32_t ps = c->page_size;
  if (ps < 1 || ps > 1024 || (ps & (ps - 1)) != 0)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: %s.page_size is %d; expected a power of two in 1..1024", op, name, ps);
  const int64_t page = cache_page_bytes(layout, head_dim, ps);
  if (c->num_pages < 1 || c->num_pages > INT64_MAX / page)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: %s.num_pages is %lld; expected >= 1 (and a cache below 2^63 bytes)",
                op, name, (long long)c->num_pages);
  if (c->num_positions < 1)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: %s.num_positions is %lld; expected >= 1", op, name,
                (long long)c->num_positions);
  if (c->dcp_world < 0 || c->dcp_rank < 0 || c->dcp_rank >= std::max(c->dcp_world, 1))
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: %s.dcp_world is %d and %s.dcp_rank %d; expected dcp_world >= 0 "
                "and 0 <= dcp_rank < max(dcp_world, 1)", op, name, c->dcp_world, name, c->dcp_rank);
  if (!(c->eps >= 0.0f) || c->eps == INFINITY)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: %s.eps is %g; expected a finite value >= 0", op, name, (double)c->eps);
  if (c->cache == nullptr || c->norm_weight == nullptr || c->rotary == nullptr || cache_slots == nullptr)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: %s.cache, %s.norm_weight, %s.rotary and cache_slots must be "
                "non-null", op, name, name, name);
  const int align = device == DSA_DEVICE_HOST ? 1 : 16;
  if (!aligned(c->cache, align) || !aligned(c->norm_weight, align) || !aligned(c->rotary, align) ||
      !aligned(cache_slots, device == DSA_DEVICE_HOST ? 1 : 8))
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: on the GPU, %s.cache, %s.norm_weight and %s.rotary must be "
                "16-byte aligned and cache_slots 8-byte aligned", op, name, name, name);
  out->cache = c->cache, out->cache_slots = cache_slots;
  out->norm_weight = c->norm_weight, out->rotary = c->rotary;
  out->num_positions = c->num_positions, out->capacity = c->num_pages * ps;
  out->page_stride = page, out->eps = c->eps;
  out->page_log2 = page_log2_of(ps);
  out->dcp_world = c->dcp_world, out->dcp_rank = c->dcp_rank;
  out->layout = layout;
  return DSA_STATUS_OK;
}

namespace {

struct StoreOpLaunch {
  int32_t head_dim;
  uint32_t num_vectors;
  const float* vectors;
  const int32_t* positions;
  uint32_t* error_count;
  const int32_t* records;    // non-null: positions and slots from request or segment records
  int64_t num_cache_slots;   // records only
  uint32_t extend;           // records only: extend (not decode) records
  uint32_t ratio;            // records only: tokens per entry (128, or 4)
  uint32_t records_ahead;    // records only: DSA_FLAG_RECORDS_AHEAD (records and slots read before the wait)
  StoreLaunch store;
  // A storing prefill's vectors (store_prefill_vectors): vector v is compress record v of the launch,
  // from the launch parameters (kInline > 0) or `segments` (a device plan, capped by counts[0]).
  const dsa_segment* segments;
  const int64_t* counts;
  const int32_t* load_indices;
  int64_t first_record;      // the launch's first record in the compress list (its compact out row)
  int64_t num_tokens;
  int64_t batch_size;
  int64_t num_slots;
  int32_t compact;
};

// Whether the prefill stored vector v's out row (it skips invalid records and, in a continuing chunk,
// a bad load slot; the skip was counted there); if so its out row, cache slot and rotary row.
__device__ __forceinline__ bool prefill_vector(const StoreOpLaunch& p, const dsa_segment& seg, uint32_t v,
                                               int64_t* row, int64_t* loc, int32_t* pos) {
  if (is_sentinel(seg) || !segment_ok(seg, true, p.num_tokens, p.batch_size)) return false;
  if (segment_continues(seg) && !slot_ok(__ldg(p.load_indices + seg.batch_id), p.num_slots)) return false;
  *row = p.compact ? p.first_record + v : (int64_t)seg.ragged_id;
  *loc = __ldg(p.store.cache_slots + seg.ragged_id);
  *pos = (int32_t)(seg.position - (DSA_CHUNK - 1));
  return true;
}

// One request row (threadIdx.y) per vector. kSegments: a storing prefill's vectors (kInline: how
// many records its launch carries, 0 for a device plan's), launched behind the prefill's own
// launches, whose blocks let it start only after their own wait for the producers: everything but
// `out` may be read at once, `out` after the wait. Every thread waits (on every path), so the grid
// completes only after the prefill.
template <int VEC, bool kSegments, int kInline>
__global__ void __launch_bounds__(kStoreMaxThreads)
    kv_store_kernel(const __grid_constant__ StoreOpLaunch p, const __grid_constant__ SegmentBlock<kInline> list) {
  const int D = p.head_dim;
  const uint32_t v = blockIdx.x * blockDim.y + threadIdx.y;
  const int ch = (int)threadIdx.x * VEC;
  float x[VEC];
  StoreOperands<VEC> o;
  int64_t loc = -1, row = v;
  int32_t pos = 0;
  if constexpr (kSegments) {
    uint32_t count = p.num_vectors;
    if (kInline == 0 && p.counts != nullptr) count = (uint32_t)max((int64_t)0, min((int64_t)count, p.counts[0]));
    const bool stored = v < count && prefill_vector(p, kInline > 0 ? list.r[v] : p.segments[v], v, &row, &loc, &pos);
    if (stored) {
      load_weights<VEC>(o, p.store, ch);
      load_rotary<VEC>(o, p.store, D, ch, pos);
    }
    wait_for_producers();
    allow_dependents();
    if (!stored) return;
    load_floats<VEC>(x, p.vectors + row * D + ch);
  } else {
    // the caller's promise (DSA_FLAG_RECORDS_AHEAD): records and slots were written before our producer ran
    const bool ahead = p.records_ahead != 0 && p.records != nullptr && v < p.num_vectors;
    int check = kStoreSkip;
    if (ahead) {  // and the store's operands with them: after the wait only the vector is left to read
      check = record_row(p.records, p.extend != 0, v, p.store.cache_slots, p.num_cache_slots, p.ratio, &loc, &pos);
      if (check == kStoreWrite) {
        load_weights<VEC>(o, p.store, ch);
        load_rotary<VEC>(o, p.store, D, ch, pos);
      }
    }
    wait_for_producers();
    if (v >= p.num_vectors || (ahead && check != kStoreWrite)) {  // a row that stores nothing reads nothing more
      allow_dependents();
      if (check == kStoreCount && ch == 0) count_error(p.error_count);
      return;
    }
    load_floats<VEC>(x, p.vectors + (int64_t)v * D + ch);
    if (!ahead) load_weights<VEC>(o, p.store, ch);
    if (p.records == nullptr) {
      loc = __ldg(p.store.cache_slots + v), pos = __ldg(p.positions + v);
    } else {
      if (!ahead)
        check = record_row(p.records, p.extend != 0, v, p.store.cache_slots, p.num_cache_slots, p.ratio, &loc, &pos);
      if (check != kStoreWrite) {
        allow_dependents();
        if (check == kStoreCount && ch == 0) count_error(p.error_count);
        return;
      }
    }
    allow_dependents();
    if (!ahead) load_rotary<VEC>(o, p.store, D, ch, pos);
  }
  if constexpr (VEC == 4) {
    if (p.store.layout == DSA_CACHE_INDEXER) {  // one warp per vector (D = 128)
      aim_indexer_store<VEC>(o, p.store, loc, pos);
      indexer_store<VEC>(p.store, x, o, ch, p.error_count);
      return;
    }
  }
  aim_store<VEC>(o, p.store, loc, pos, D);
  store_vector<VEC>(p.store, x, o, D, ch, (int)blockDim.x, p.error_count);
}

template <bool kSegments, int kInline>
cudaError_t launch_store(int vec, dim3 grid, dim3 block, cudaStream_t s, unsigned mode, const StoreOpLaunch& a,
                         const SegmentBlock<kInline>& list) {
  return vec == 4 ? launch(kv_store_kernel<4, kSegments, kInline>, grid, block, s, mode, a, list)
                  : launch(kv_store_kernel<2, kSegments, kInline>, grid, block, s, mode, a, list);
}

// Channels per thread for D and the vectors' alignment, and the grid of `count` vectors.
// The standalone store's shape (launch_policy.h), refused when the vectors are not 8-byte aligned.
dsa_status store_launch_shape(int head_dim, const float* vectors, int64_t count, int* vec, dim3* grid, dim3* block,
                              const char* op) {
  const Shape shape = store_shape(head_dim, vectors, count, vec);
  if (*vec == 0) return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: vectors must be 8-byte aligned on the GPU", op);
  if (!shape.fits) return too_large(op);
  *grid = grid_of(shape), *block = block_of(shape);
  return DSA_STATUS_OK;
}

}  // namespace

// A host plan's records in launches of at most DSA_INLINE_RECORDS (SegmentBlock), chained with PDL.
dsa_status store_prefill_vectors(const dsa_c128_prefill_params& p, const StoreLaunch& st, int64_t num_compress,
                                 cudaStream_t stream, const char* op) {
  StoreOpLaunch a = {};
  a.head_dim = p.head_dim, a.vectors = p.out, a.error_count = p.error_count, a.store = st;
  a.load_indices = p.load_indices != nullptr ? p.load_indices : p.indices;
  a.num_tokens = p.num_tokens, a.batch_size = p.batch_size, a.num_slots = p.num_slots;
  a.compact = p.out_layout == DSA_OUT_COMPACT;
  int vec = 0;
  dim3 grid, block;
  if (!(p.flags & DSA_FLAG_HOST_PLAN)) {
    a.num_vectors = (uint32_t)num_compress, a.segments = p.compress, a.counts = p.counts;
    DSA_TRY(store_launch_shape(p.head_dim, p.out, num_compress, &vec, &grid, &block, op));
    return launch_status(launch_store<true, 0>(vec, grid, block, stream, kLaunchPdl, a, SegmentBlock<0>{}), op);
  }
  for (int64_t first = 0; first < num_compress; first += DSA_INLINE_RECORDS) {
    const int64_t n = std::min<int64_t>(DSA_INLINE_RECORDS, num_compress - first);
    a.num_vectors = (uint32_t)n, a.first_record = first;
    DSA_TRY(store_launch_shape(p.head_dim, p.out, n, &vec, &grid, &block, op));
    DSA_TRY(launch_status(with_records<DSA_INLINE_RECORDS>(
                              n, [&](int64_t i) { return p.compress[first + i]; },
                              [&](const auto& list) {
                                constexpr int k = std::decay_t<decltype(list)>::kSize;
                                return launch_store<true, k>(vec, grid, block, stream, kLaunchPdl, a, list);
                              }),
                          op));
  }
  return DSA_STATUS_OK;
}

}  // namespace dsa

extern "C" int64_t dsa_kv_page_bytes(int32_t head_dim, int32_t page_size) {
  if (head_dim < 128 || head_dim % 64 != 0 || page_size < 1) return 0;
  return dsa::page_bytes(head_dim, page_size);
}

extern "C" int64_t dsa_indexer_page_bytes(int32_t head_dim, int32_t page_size) {
  if (head_dim != dsa::kIndexerDim || page_size < 1) return 0;
  return dsa::indexer_page_bytes(head_dim, page_size);
}

namespace dsa {
namespace {

struct StoreChecked {
  bool nothing = false;
  StoreLaunch store = {};
};

dsa_status check_store(const dsa_kv_store_params& p, const char* op, StoreChecked* c) {
  if (p.num_vectors < 0 || p.num_vectors > INT32_MAX)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: num_vectors is %lld; expected 0..%d", op, (long long)p.num_vectors,
                INT32_MAX);
  DSA_TRY(check_struct(p.cache, op));
  if (p.cache->layout != DSA_CACHE_V4 && p.cache->layout != DSA_CACHE_INDEXER)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: cache.layout is %d; expected %d (DSA_CACHE_V4) or %d (DSA_CACHE_INDEXER)",
                op, p.cache->layout, DSA_CACHE_V4, DSA_CACHE_INDEXER);
  if (p.ratio != 0 && p.ratio != DSA_CHUNK && p.ratio != 4)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: ratio is %d; expected 0 or 128 (c128 records) or 4 (c4 records)", op,
                p.ratio);
  DSA_TRY(store_launch(p.cache, p.cache_slots, p.head_dim, p.device, op, &c->store, p.cache->layout));
  if (p.num_vectors == 0) return c->nothing = true, DSA_STATUS_OK;
  const uint32_t kinds = p.flags & (DSA_FLAG_STORE_DECODE_RECORDS | DSA_FLAG_STORE_EXTEND_RECORDS);
  if (kinds == (DSA_FLAG_STORE_DECODE_RECORDS | DSA_FLAG_STORE_EXTEND_RECORDS))
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: at most one of the decode and extend record flags", op);
  if (p.vectors == nullptr || (kinds ? (p.records == nullptr || p.positions != nullptr || p.num_cache_slots < 0)
                                     : (p.positions == nullptr || p.records != nullptr)))
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: vectors must be non-null, and positions non-null without records or "
                "null with records (then records non-null, num_cache_slots >= 0)", op);
  return DSA_STATUS_OK;
}

dsa_status store_device(const dsa_kv_store_params& p, const StoreChecked& c, int, cudaStream_t s, const char* op) {
  const uint32_t kinds = p.flags & (DSA_FLAG_STORE_DECODE_RECORDS | DSA_FLAG_STORE_EXTEND_RECORDS);
  if (kinds && !aligned(p.records, 16))
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: records must be 16-byte aligned on the GPU", op);
  int vec = 0;
  dim3 grid, block;
  DSA_TRY(store_launch_shape(p.head_dim, p.vectors, p.num_vectors, &vec, &grid, &block, op));
  if (c.store.layout == DSA_CACHE_INDEXER && vec != 4)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: vectors must be 16-byte aligned on the GPU for an indexer cache", op);
  StoreOpLaunch a = {};
  a.head_dim = p.head_dim, a.num_vectors = (uint32_t)p.num_vectors, a.vectors = p.vectors;
  a.positions = p.positions, a.error_count = p.error_count, a.store = c.store;
  a.records = kinds ? p.records : nullptr, a.num_cache_slots = p.num_cache_slots;
  a.extend = (p.flags & DSA_FLAG_STORE_EXTEND_RECORDS) != 0;
  a.ratio = p.ratio ? (uint32_t)p.ratio : (uint32_t)DSA_CHUNK;
  a.records_ahead = (p.flags & DSA_FLAG_RECORDS_AHEAD) != 0;
  const unsigned mode = (p.flags & DSA_FLAG_PDL) ? kLaunchPdl : 0u;
  return launch_status(launch_store<false, 0>(vec, grid, block, s, mode, a, SegmentBlock<0>{}), op);
}

}  // namespace
}  // namespace dsa

extern "C" dsa_status dsa_kv_store(const dsa_kv_store_params* params, void* stream) {
  using namespace dsa;
  return dispatch<StoreChecked>(params, stream, "dsa_kv_store", check_store,
                                host_store,
                                store_device);
}
