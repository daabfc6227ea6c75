/*
 * dsa_kernels.h: the whole C ABI of pydsa (libdsa_kernels).
 *
 * Plain C99 / C++. Every op takes a pointer to its params struct and, last, the CUDA stream
 * (a cudaStream_t passed as void*; NULL means the legacy default stream). Ops never synchronize,
 * never allocate, and can be captured in a CUDA graph.
 *
 * Every params struct begins with `struct_size`: set it to sizeof(the struct) as your header
 * declares it. The library refuses a size it does not know (DSA_STATUS_ABI_MISMATCH). Structs
 * only grow at the end; a field appended later comes with a DSA_ABI_VERSION bump.
 *
 * ABI version rule: DSA_ABI_VERSION changes whenever any declaration below changes in a way a
 * compiled caller could notice (a field, an enum value, a function signature). Callers compare
 * dsa_abi_version() with the DSA_ABI_VERSION they were built with and refuse a mismatch.
 *
 * Device selection: `device` is the CUDA ordinal that owns every pointer of the call, or
 * DSA_DEVICE_HOST (-1) for host memory, which runs the host backend on the calling thread
 * (same results, `stream` ignored). The library makes `device` current for the launch and
 * restores the caller's current device afterwards.
 *
 * Errors: every op returns a dsa_status. dsa_last_error() returns a sentence (thread-local,
 * valid until the thread's next call) naming the argument that was wrong and why.
 * Index values inside tensors (slots, device plans' records) are data: out-of-range values are skipped
 * and counted in the optional device-side `error_count` (a uint32 the caller owns and zeroes). A host
 * plan (DSA_FLAG_HOST_PLAN) is read on the host first: a record that does not fit the call fails it
 * with DSA_STATUS_INVALID_ARGUMENT, naming the record, before anything runs.
 */
#ifndef DSA_KERNELS_H
#define DSA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define DSA_API __declspec(dllexport)
#else
#define DSA_API __attribute__((visibility("default")))
#endif

#define DSA_ABI_VERSION 11
#define DSA_DEVICE_HOST (-1)
#define DSA_CHUNK 128            /* tokens per compressed chunk */
#define DSA_MAX_DESTINATIONS 8   /* destination sets per metadata copy */
#define DSA_SEGMENT_SENTINEL 0xFFFFFFFFu
#define DSA_INLINE_RECORDS 256   /* plan records carried by one prefill launch (DSA_FLAG_HOST_PLAN) */
#define DSA_UPLOAD_RECORDS 1024  /* plan records carried by one dsa_c128_upload_plan launch */
#define DSA_MAX_DRAFTS 16        /* draft tokens per request in one verify */
#define DSA_COMMIT_LAYERS 64     /* state buffers carried by one copying commit launch */

typedef enum dsa_status {
  DSA_STATUS_OK = 0,
  DSA_STATUS_INVALID_ARGUMENT = 1, /* a field of the params is wrong; see dsa_last_error() */
  DSA_STATUS_ABI_MISMATCH = 2,     /* struct_size is not one this library knows */
  DSA_STATUS_CAPACITY = 3,         /* an output buffer is too small for the request */
  DSA_STATUS_CUDA_ERROR = 4,       /* the CUDA runtime refused the launch */
  DSA_STATUS_NO_DEVICE = 5         /* a device call on a machine or build without CUDA */
} dsa_status;

typedef enum dsa_struct_id {
  DSA_STRUCT_SEGMENT = 0,
  DSA_STRUCT_PLAN_PARAMS = 1,
  DSA_STRUCT_DECODE_PARAMS = 2,
  DSA_STRUCT_PREFILL_PARAMS = 3,
  DSA_STRUCT_METADATA_SOURCES = 4,
  DSA_STRUCT_METADATA_DESTINATION = 5,
  DSA_STRUCT_METADATA_PARAMS = 6,
  DSA_STRUCT_PLAN_UPLOAD_PARAMS = 7,
  DSA_STRUCT_VERIFY_PARAMS = 8,
  DSA_STRUCT_COMMIT_PARAMS = 9,
  DSA_STRUCT_KV_CACHE = 10,
  DSA_STRUCT_KV_STORE_PARAMS = 11,
  DSA_STRUCT_RECORDS_PARAMS = 12,
  DSA_STRUCT_C4_PARAMS = 13,
  DSA_STRUCT_C4_PLAN_PARAMS = 14,
  DSA_STRUCT_C128_OFFLINE_PARAMS = 15
} dsa_struct_id;

/* Flags for the `flags` field of the kernel params. */
#define DSA_FLAG_PDL 1u       /* launch with programmatic dependent launch (sm_90+) */
#define DSA_FLAG_HOST_PLAN 2u /* prefill: `compress`, `write` and `counts` are host memory, read during the
                                 call; the records travel inside the kernel launches, so no staging
                                 copy, allocation or synchronization is needed. A CUDA graph that
                                 captures such a call keeps the records of capture time. An
                                 uncaptured call whose plan fits the GPU at once may take one
                                 cooperative launch (see DSA_FLAG_NO_COOPERATIVE). */
#define DSA_FLAG_NO_COOPERATIVE 4u /* prefill: never a cooperative launch, ordinary launches instead. A
                                      cooperative grid starts only once all its blocks fit at once,
                                      so next to kernels of other streams it waits for them to leave
                                      room; ordinary launches start in whatever room there is. */
#define DSA_FLAG_STORE_DECODE_RECORDS 16u /* kv_store: positions and slots from decode records */
#define DSA_FLAG_STORE_EXTEND_RECORDS 32u /* kv_store: positions and slots from extend records */
#define DSA_FLAG_VERIFY_FP32_BETWEEN_DRAFTS 64u /* verify: with a bf16 state, the running state
                                      stays fp32 from draft to draft (each bank entry rounded once, as it
                                      is stored). Without
                                      it the state is rounded between drafts as a decode's store rounds
                                      it, so a verified token leaves exactly the state a decoded one
                                      would. No effect on an fp32 state. */
#define DSA_FLAG_C4_REJECT_ALL 128u /* c4 verify: the step may accept none of the drafts (the first
                                      draft is not a token already sampled), so V <= R - 7 instead of R - 6 */
#define DSA_FLAG_RECORDS_AHEAD 256u /* c4 decode with decode_records, kv_store with records: the records
                                      and cache_slots were complete before the launch just before this one
                                      on the stream began (a step's plan and slots written ahead of its
                                      layers). With DSA_FLAG_PDL the kernels then read them (kv_store: and
                                      the cache's norm weights and rotary rows) before waiting for that
                                      launch; without this flag every read waits. Other ops and modes
                                      ignore it. */
#define DSA_FLAG_DECODE_RECORDS 8u /* decode: `indices` points at batch_size 16-byte records, one per
                                      request: {int32 seq_len, int32 slot, int32 load slot, int32 unused}
                                      (the request record, docs/spec.md, records), 16-byte aligned
                                      on the GPU; seq_lens and load_indices must be null. The load slot
                                      plays load_indices' part. */

/* Element type of the c128 state buffer (docs/spec.md, the state, output layouts). Arithmetic is fp32 either way; a bf16 state
 * is widened on read and rounded to nearest even on store. */
typedef enum dsa_state_dtype {
  DSA_STATE_FLOAT32 = 0,
  DSA_STATE_BFLOAT16 = 1
} dsa_state_dtype;

/* Layout of the prefill output (docs/spec.md, the state, output layouts). */
typedef enum dsa_out_layout {
  DSA_OUT_RAGGED = 0,  /* out [num_tokens, D]: a chunk's vector at the ragged row of its closing token */
  DSA_OUT_COMPACT = 1  /* out [compress_capacity, D]: row i = the vector of compress record i */
} dsa_out_layout;

DSA_API int32_t dsa_abi_version(void);
DSA_API const char* dsa_version_string(void);
DSA_API const char* dsa_status_string(dsa_status status);
DSA_API const char* dsa_last_error(void);
/* sizeof() of a struct as this library was built; 0 for an unknown id. */
DSA_API size_t dsa_struct_size(dsa_struct_id id);
/* Comma-separated CUDA architectures compiled in (e.g. "90"), or "" in a host-only build. */
DSA_API const char* dsa_cuda_architectures(void);
/* CUDA runtime version the library was built with and links statically (e.g. 13000), 0 in a
 * host-only build; the NVIDIA driver must support at least this version. */
DSA_API int32_t dsa_cuda_runtime_version(void);
/* CUDA version the installed driver supports (e.g. 13000), 0 without a driver. */
DSA_API int32_t dsa_driver_version(void);
/* Number of CUDA devices usable by this library (0 without a GPU or driver). */
DSA_API int32_t dsa_device_count(void);
/* Launches one empty kernel (1 block, 32 threads) on `device`: the launch-overhead floor that
 * benchmarks and consumers compare the ops against. */
DSA_API dsa_status dsa_empty_launch(int32_t device, void* stream);

/* ------------------------------------------------------------------------------------------ */
/* Prefill plan (docs/spec.md, the plan).                                                                   */

/* One segment of a request's new tokens, all inside one 128-token chunk. 16 bytes, little-endian.
 * First token: ragged row ragged_id - window_len + 1, global position position - window_len + 1.
 * A record whose four fields are DSA_SEGMENT_SENTINEL is padding. */
typedef struct dsa_segment {
  uint32_t ragged_id;  /* ragged row of the segment's last token */
  uint32_t batch_id;   /* request index */
  uint32_t position;   /* global position of the segment's last token */
  uint32_t window_len; /* tokens in the segment, 1..128 */
} dsa_segment;

typedef struct dsa_plan_params {
  uint32_t struct_size;
  uint32_t graph_mode;          /* 0: plain. 1: pad both lists with sentinels to their capacity */
  int64_t batch_size;           /* B >= 0 */
  int64_t num_tokens;           /* rows of the ragged input; plain: == sum(extend_lens);
                                   graph: >= sum(extend_lens) (padding rows belong to no segment) */
  const int64_t* seq_lens;      /* [B] int64, host; may be null when B == 0 */
  const int64_t* extend_lens;   /* [B] int64, host; may be null when B == 0 */
  dsa_segment* compress;        /* [compress_capacity] host, written */
  dsa_segment* write;           /* [write_capacity] host, written */
  int64_t compress_capacity;    /* records available in `compress` */
  int64_t write_capacity;       /* records available in `write` */
  int64_t* num_compress;        /* out: real compress records (not counting padding); may be null */
  int64_t* num_write;           /* out: real write records; may be null */
} dsa_plan_params;

/* Plans on the host; nothing is written to the record arrays unless the whole input is valid. */
DSA_API dsa_status dsa_c128_plan_prefill(const dsa_plan_params* params);

/* Records needed for a plan: compress <= sum(extend)/128 + B, write <= B. */
DSA_API int64_t dsa_c128_compress_capacity(int64_t num_tokens, int64_t batch_size);

/* A host plan copied into a device plan buffer (CUDA-graph mode: the captured prefill reads
 * `counts` and the records from fixed device addresses). */
typedef struct dsa_plan_upload_params {
  uint32_t struct_size;
  int32_t device;               /* CUDA ordinal owning the destination, or DSA_DEVICE_HOST */
  const dsa_segment* compress;  /* [num_compress] host memory, read during the call */
  const dsa_segment* write;     /* [num_write] host memory, read during the call */
  int64_t num_compress;         /* compress records to copy, 0..compress_capacity */
  int64_t num_write;            /* write records to copy, 0..write_capacity */
  dsa_segment* device_compress; /* [compress_capacity] destination on `device` */
  dsa_segment* device_write;    /* [write_capacity] destination on `device` */
  int64_t compress_capacity;
  int64_t write_capacity;
  int64_t* device_counts;       /* [2] destination on `device`: {num_compress, num_write} */
} dsa_plan_upload_params;

/* Writes counts = {num_compress, num_write} and the records into the destination, in stream
 * order. The records travel inside kernel launches (up to DSA_UPLOAD_RECORDS per launch), so the
 * host arrays may be reused as soon as the call returns: no staging memory, no event, no
 * synchronization. Records past the counts are left as they were; a prefill given `counts`
 * never reads them. Captured in a CUDA graph, the upload replays the records of capture time. */
DSA_API dsa_status dsa_c128_upload_plan(const dsa_plan_upload_params* params, void* stream);

/* ------------------------------------------------------------------------------------------ */
/* The KV-cache store (docs/spec.md, "The store").
 *
 * A chunk's compressed vector x [D] becomes one cache entry: RMSNorm y = x / sqrt(mean(x^2) + eps) * w;
 * channels 0 .. D-65 rounded to bf16 and quantized to fp8 e4m3 in groups of 64, each group with a
 * power-of-two scale (its biased exponent byte: the smallest 2^e >= max(amax, 1e-4) / 448); the
 * last 64 channels (32 pairs) rotated by the rotary table's row for the chunk's first position and
 * stored as bf16. Layout (DSA_CACHE_V4): an entry is D - 64 fp8 bytes then 64 bf16 (D + 64 bytes),
 * plus a scale row of D/64 - 1 bytes padded to 8 (the pad is never written). A page holds page_size
 * data rows, then their scale rows, padded to a multiple of D + 64 bytes (D = 512, page 2: 1728 B).
 * Cache slot `loc` lives in page loc / page_size, entry loc % page_size. Slots are data: a negative
 * slot is skipped silently (not held on this GPU), one past the cache (or a rotary row outside the
 * table) is skipped and counted in error_count. Nothing else in the cache is written.
 *
 * The decode, prefill and verify take an optional `store` and store every vector they close in the
 * same call (`out` may then be null, except for a prefill on the GPU: its vectors pass through
 * `out`, and a store launch behind the prefill's own ones reads them there); dsa_kv_store stores
 * given vectors. */

#define DSA_CACHE_V4 0      /* fp8 nope + bf16 rope + ue8m0 scales (the c128 and c4 main caches) */
#define DSA_CACHE_INDEXER 1 /* the c4 indexer's: D = 128; an entry is 128 fp8 e4m3 codes of the
                               normed, rotated, Hadamard-transformed vector and one fp32 scale; a page holds
                               page_size entries' codes (128 B each), then their scales (4 B each). Only the
                               c4 ops store into it. */

typedef struct dsa_kv_cache {
  uint32_t struct_size;
  int32_t layout;              /* DSA_CACHE_V4 or DSA_CACHE_INDEXER */
  uint8_t* cache;              /* [num_pages, dsa_kv_page_bytes(D, page_size)] on the op's device, written */
  int64_t num_pages;           /* pages in `cache` (slots: num_pages * page_size) */
  int32_t page_size;           /* entries per page, a power of two, 1..1024 */
  float eps;                   /* RMSNorm epsilon, >= 0 */
  const float* norm_weight;    /* [D] fp32 */
  const float* rotary;         /* [num_positions, 64] fp32: (cos, sin) of pair l at 2l, 2l+1 */
  int64_t num_positions;       /* rows of `rotary` */
  /* Decode-context-parallel ownership: with dcp_world > 1 this cache is rank dcp_rank's share
   * of a cache sharded over dcp_world GPUs. The entry of cache slot loc >= 0 is written here only when
   * loc % dcp_world == dcp_rank, at local slot loc / dcp_world (num_pages counts the local pages);
   * other slots are skipped silently, as negative ones are. 0 or 1: this cache owns every slot
   * (a zeroed struct needs no DCP fields). 0 <= dcp_rank < max(dcp_world, 1). */
  int32_t dcp_world;
  int32_t dcp_rank;
} dsa_kv_cache;

/* Bytes of one page of the cache for head dim D (a multiple of 64, >= 128). */
DSA_API int64_t dsa_kv_page_bytes(int32_t head_dim, int32_t page_size);
/* Bytes of one page of the c4 indexer's cache (DSA_CACHE_INDEXER) for D = 128 (0 otherwise). */
DSA_API int64_t dsa_indexer_page_bytes(int32_t head_dim, int32_t page_size);

typedef struct dsa_kv_store_params {
  uint32_t struct_size;
  uint32_t flags;              /* DSA_FLAG_PDL */
  int32_t device;              /* CUDA ordinal owning every pointer, or DSA_DEVICE_HOST */
  int32_t head_dim;            /* D: a multiple of 64, >= 128 */
  int64_t num_vectors;         /* N >= 0 */
  const float* vectors;        /* [N, D] fp32 */
  const int32_t* positions;    /* [N] rotary row of each vector (its chunk's first position) */
  const int64_t* cache_slots;  /* [N] cache slot of each vector */
  const dsa_kv_cache* cache;   /* host memory, read during the call */
  uint32_t* error_count;       /* [1] incremented per skipped vector; may be null */
  /* with DSA_FLAG_STORE_DECODE_RECORDS or DSA_FLAG_STORE_EXTEND_RECORDS, vector i's position
   * and slot come from records[i] (request or segment records, docs/spec.md, records; word 0 = seq_len) and
   * positions must be null: decode, stored only when seq_len is a positive multiple of 128, at
   * cache_slots[i]; extend, 0xFFFFFFFF skipped, else at cache_slots[word 1 & 0xFFFF]. Position
   * seq_len - 128. A record whose slot index is not below num_cache_slots, or an extend record with
   * seq_len < 128, is skipped and counted. */
  const int32_t* records;      /* [N, 4] */
  int64_t num_cache_slots;     /* entries of cache_slots (records only) */
  /* tokens per entry of the records' layer, 128 (0 means 128) or 4 (a c4 layer: decode rows stored
   * when seq_len is a positive multiple of 4, extend records with seq_len < 4 counted, position seq_len - 4).
   * A cache of layout DSA_CACHE_INDEXER (D = 128) takes the indexer's store. */
  int32_t ratio;
  int32_t reserved;            /* 0 */
} dsa_kv_store_params;

DSA_API dsa_status dsa_kv_store(const dsa_kv_store_params* params, void* stream);

/* ------------------------------------------------------------------------------------------ */
/* Online c128 compression (docs/spec.md, online c128). kv_score, ape and out are fp32, the state fp32 or bf16
 * (state_dtype); D = head_dim, a positive multiple of 64.
 * state row of a slot: [m (D) | s (D) | k (D)]; kv_score row: [kv (D) | score (D)].             */

typedef struct dsa_c128_decode_params {
  uint32_t struct_size;
  uint32_t flags;           /* DSA_FLAG_* */
  int32_t device;           /* CUDA ordinal owning every pointer, or DSA_DEVICE_HOST */
  int32_t head_dim;         /* D */
  int64_t num_slots;        /* rows of `state` */
  int64_t batch_size;       /* B >= 0 */
  void* state;              /* [num_slots, 1, 3D] of state_dtype, read and written */
  const float* kv_score;    /* [B, 2D] */
  float* out;               /* [B, D], written only for requests that close a chunk; may be null with a store */
  const float* ape;         /* [128, D] */
  const int32_t* indices;   /* [B] slot of each request (distinct among live rows: two rows updating
                               one slot race) */
  const int32_t* seq_lens;  /* [B] length including the new token; <= 0 is padding */
  uint32_t* error_count;    /* [1] incremented per skipped out-of-range slot; may be null */
  int32_t state_dtype;      /* dsa_state_dtype */
  int32_t reserved;         /* 0 */
  const int32_t* load_indices; /* [B] slot holding the state each request continues (read when the token
                                  does not start a chunk), e.g. a verify's accepted bank entry
                                  resolved by dsa_c128_commit; null: indices */
  const dsa_kv_cache* store;   /* host memory, read during the call; null: no store */
  const int64_t* cache_slots;  /* [B] cache slot of the vector closed at each row (read only for rows that close a
                                  chunk); required with `store` */
} dsa_c128_decode_params;

typedef struct dsa_c128_prefill_params {
  uint32_t struct_size;
  uint32_t flags;               /* DSA_FLAG_* */
  int32_t device;               /* CUDA ordinal owning every pointer, or DSA_DEVICE_HOST */
  int32_t head_dim;             /* D */
  int64_t num_slots;            /* rows of `state` */
  int64_t batch_size;           /* B: length of indices / load_indices */
  int64_t num_tokens;           /* N: rows of kv_score */
  void* state;                  /* [num_slots, 1, 3D] of state_dtype, read and written */
  const float* kv_score;        /* [N, 2D] ragged new tokens */
  float* out;                   /* ragged: [N, D], written at chunk-closing rows only;
                                   compact: [compress_capacity, D], row i for compress record i;
                                   null only with `store` on the host backend (a storing
                                   prefill on the GPU writes out, then stores from it) */
  const float* ape;             /* [128, D] */
  const int32_t* indices;       /* [B] slot receiving each request's trailing partial state (distinct
                                   among requests with a write segment: stores into one slot race) */
  const int32_t* load_indices;  /* [B] slot holding the partial state to continue; null: indices */
  const dsa_segment* compress;  /* [compress_capacity] segments closing a chunk (device memory, or
                                   host memory with DSA_FLAG_HOST_PLAN) */
  const dsa_segment* write;     /* [write_capacity] trailing partial segments (likewise) */
  int64_t compress_capacity;    /* records readable in `compress` (grid is sized from this) */
  int64_t write_capacity;       /* records readable in `write` */
  const int64_t* counts;        /* [2] {num_compress, num_write} in the op's memory, read by the
                                   kernels (CUDA-graph mode: re-plan without re-capture); with
                                   DSA_FLAG_HOST_PLAN in host memory, read during the call; null:
                                   every record up to the capacities is processed */
  uint32_t* error_count;        /* [1] incremented per skipped record or slot; may be null */
  int32_t state_dtype;          /* dsa_state_dtype */
  int32_t out_layout;           /* dsa_out_layout */
  const dsa_kv_cache* store;   /* host memory, read during the call; null: no store */
  const int64_t* cache_slots;  /* [N] (ragged rows) cache slot of the vector closed at each row (read only for rows that close a
                                  chunk); required with `store` */
} dsa_c128_prefill_params;

DSA_API dsa_status dsa_c128_decode(const dsa_c128_decode_params* params, void* stream);
DSA_API dsa_status dsa_c128_prefill(const dsa_c128_prefill_params* params, void* stream);

/* ------------------------------------------------------------------------------------------ */
/* The ratio-4 compressor (docs/spec.md, "The ratio-4 compressor").
 *
 * Each c4 layer runs two compressors over the same positions and cache slots: the main one (D = 512,
 * store DSA_CACHE_V4) and the indexer's (D = 128, store DSA_CACHE_INDEXER). A token's input row is fp32
 * [kv_A | kv_B | score_A | score_B] (4 D); entry n closes at position 4n + 3 and is, per channel, the
 * softmax over the A halves of positions 4n-4 .. 4n-1 (absent for n = 0) and the B halves of 4n .. 4n+3
 * of kv, with logits score + ape[j] (ape fp32 [8, D]: rows 0..3 for the A terms, 4..7 for the B terms).
 * A store uses rotary row 4n (= seq_len - 4 at the closing token).
 *
 * State: a ring of raw input rows, [ring_rows, 4D] fp32 or bf16 (rounded to nearest even), viewed as
 * groups of 4 rows (one quartet, rows ordered by position % 4). Where each position lives is the
 * caller's choice, passed in the c4 records (below; docs/spec.md), or pydsa's request-scoped ring: request
 * slot s owns rows s*R .. s*R+R-1, position p at row s*R + p % R (R = ring_size, a multiple of 4, >= 8).
 *
 *   dsa_c4_decode  one new token per request: writes its row to the ring and, when seq_len % 4 == 0,
 *                  closes entry seq_len/4 - 1 from the ring's 8 rows (the new token's included), writes
 *                  `out` and stores; both compressors (and both stores) in one launch.
 *   dsa_c4_extend  new tokens at ragged rows (prefill, chunked prefill, a verify planned by the engine):
 *                  every compress record closes an entry (window rows from the ring, then from the
 *                  input), `out` row i for record i (compact); then every write record copies an input
 *                  row into the ring. Two launches: every ring read of the call precedes every ring write.
 *   dsa_c4_verify  V drafts per request over pydsa's request-scoped ring: draft j of request b at input
 *                  row b*V + j; entries the drafts close are written to `out` row b*V + j and stored; every
 *                  draft's row is written to the ring. No commit: the next call starts at the first
 *                  rejected position. V must be at most dsa_c4_max_drafts(R, ...).
 *
 * Records and slots are data: a record whose rows lie outside the ring or the input is skipped and
 * counted in error_count (a decode row still writes its ring row when only its read groups are bad); a
 * padding record (seq_len or ragged_id 0xFFFFFFFF) and, in the request-scoped modes, a negative slot or
 * seq_len (<= 0 in decode, < 0 in verify) are skipped silently. */

/* The 16-byte decode record: {u32 seq_len (with the new token), i32 write row, i32 group of the
 * previous quartet, i32 group of the current quartet}. seq_len 0 is padding. */
typedef struct dsa_c4_decode_record {
  uint32_t seq_len;
  int32_t write_row;
  int32_t previous_group;
  int32_t current_group;
} dsa_c4_decode_record;

/* The 16-byte compress record: {u32 seq_len = closing position + 1, u16 ragged row of the closing
 * token, u16 window rows read from the ring (the first ones), i32 previous group, i32 current group}. */
typedef struct dsa_c4_compress_record {
  uint32_t seq_len;
  uint16_t ragged_id;
  uint16_t ring_rows;
  int32_t previous_group;
  int32_t current_group;
} dsa_c4_compress_record;

/* The 8-byte write record: {u32 ragged row, i32 ring row}. */
typedef struct dsa_c4_write_record {
  uint32_t ragged_id;
  int32_t ring_row;
} dsa_c4_write_record;

/* One compressor of a c4 layer. */
typedef struct dsa_c4_compressor {
  int32_t head_dim;           /* D: 128, 256 or 512 (an indexer store: 128) */
  int32_t reserved;           /* 0 */
  void* ring;                 /* [ring_rows, 4D] of the call's ring_dtype, read and written */
  int64_t ring_rows;          /* rows of `ring`, a multiple of 4, >= 4 */
  const float* kv_score;      /* [rows, 4D]: decode B rows, extend num_tokens, verify B * V */
  const float* ape;           /* [8, D] */
  float* out;                 /* decode [B, D] (closing rows written), extend [num_compress, D] (row i for
                                 record i), verify [B * V, D] (closing drafts' rows); may be null */
  const dsa_kv_cache* store;  /* host memory, read during the call; null: no store */
} dsa_c4_compressor;

typedef struct dsa_c4_params {
  uint32_t struct_size;
  uint32_t flags;                 /* DSA_FLAG_PDL; verify: DSA_FLAG_C4_REJECT_ALL; extend: DSA_FLAG_HOST_PLAN
                                     (host backend only: the records are checked before anything runs and
                                     one that does not fit fails the call, naming it) */
  int32_t device;                 /* CUDA ordinal owning every pointer, or DSA_DEVICE_HOST */
  int32_t num_compressors;        /* 1 or 2 (main and indexer), each with its own ring, input and store */
  int32_t ring_dtype;             /* dsa_state_dtype of every ring */
  int32_t ring_size;              /* R of the request-scoped ring (decode without records, verify): every
                                     ring_rows a multiple of it (num_slots * R); rows in 64 bits, a slot
                                     past the ring skipped and counted */
  int64_t batch_size;             /* decode, verify: requests (0: nothing runs; inputs may be null) */
  int64_t num_tokens;             /* extend: rows of kv_score (<= 65536: 16-bit ragged rows) */
  const dsa_c4_decode_record* decode_records; /* decode: [B], or null: seq_lens and slots */
  const dsa_c4_compress_record* compress;     /* extend: [num_compress] */
  const dsa_c4_write_record* write;           /* extend: [num_write] */
  int64_t num_compress;
  int64_t num_write;
  const int32_t* seq_lens;        /* decode without records: [B] length with the new token (<= 0 padding);
                                     verify: [B] committed length before the drafts (< 0 padding) */
  const int32_t* slots;           /* [B] request-scoped ring slot (negative: not held here, skipped) */
  int32_t num_drafts;             /* verify: V, 1..dsa_c4_max_drafts(ring_size, flags & DSA_FLAG_C4_REJECT_ALL) */
  int32_t reserved;               /* 0 */
  const int64_t* cache_slots;     /* with a store: decode [B], extend [num_tokens] (ragged rows), verify
                                     [B * V]; read at closing rows; -1: not stored here */
  uint32_t* error_count;          /* [1] incremented per skipped record; may be null */
  dsa_c4_compressor compressors[2];
} dsa_c4_params;

/* The largest V dsa_c4_verify takes for a ring of R rows: R - 6 when the first draft is always
 * accepted (a target verify: it is the token already sampled), R - 7 when zero_acceptance != 0. */
DSA_API int32_t dsa_c4_max_drafts(int32_t ring_size, int32_t zero_acceptance);
DSA_API dsa_status dsa_c4_decode(const dsa_c4_params* params, void* stream);
DSA_API dsa_status dsa_c4_extend(const dsa_c4_params* params, void* stream);
DSA_API dsa_status dsa_c4_verify(const dsa_c4_params* params, void* stream);

/* ------------------------------------------------------------------------------------------ */
/* c4 plans (docs/spec.md, "c4 plans"): a step's c4 records (above) for a ring of ring_size rows per
 * state page, built from the engine's tables on the op's device in one launch, never synchronizing. The
 * ring row of position p of request row rid is
 *
 *   row(rid, p) = (s / swa_page_size) * ring_size + s % ring_size,  s = full_to_state[req_to_token[rid][p]]
 *                 (page-scoped; rid * ring_size + p mod ring_size with use_req_ring: request-scoped),
 *
 * and -1 where the tables address none: rid or p outside req_to_token, a token outside full_to_state, a
 * negative state slot (a negative rid in a request-scoped ring). Table values are data: never read out of
 * bounds. A group is floor(row / 4) (-1 for row -1). Arithmetic is 64-bit two's complement, "mod" the
 * floor modulo; a record holds the low 32 bits of each value.
 *
 *   dsa_c4_plan_decode  record b = {max(seq, 0), row(rid, p1), group(row(rid, p0)), group(row(rid, p1))},
 *                       seq = seq_lens[b], rid = req_pool_indices[b], p1 = max(seq - 1, 0), p0 = max(p1 - 4, 0).
 *   dsa_c4_plan_extend  ragged row t (0 <= t < num_tokens) is token j of request b, the request whose extend
 *                       covers t (extends laid end to end from row 0, a negative one counted as 0; rows past
 *                       them belong to none), at position pos = seq - ext + j (seq, ext: request b's lengths).
 *                       A token with (pos + 1) mod 4 == 0 closes an entry: compress record {pos + 1, t, k, g0,
 *                       g1}, k = 8 - min(j + 1, 8) window rows from the ring, g0 = group(row(rid, max(pos -
 *                       4, 0))) and g1 = group(row(rid, pos)) when k > 0, else g0 = -1 and g1 = b. A token is
 *                       kept when pos >= min(4 floor(seq / 4) - 4, seq - pad) (pad = ring_size - 6 if ring_size
 *                       > 8, else 0) or, in a page-scoped ring, pos mod swa_page_size >= swa_page_size - 4:
 *                       write record {t, row(rid, pos)}. Each list in row order, then padding records to
 *                       num_tokens rows: {0xFFFFFFFF, 0, 0, -1, -1} and {0xFFFFFFFF, -1}. */
typedef struct dsa_c4_plan_params {
  uint32_t struct_size;
  uint32_t flags;                   /* DSA_FLAG_PDL */
  int32_t device;                   /* CUDA ordinal owning every pointer, or DSA_DEVICE_HOST */
  int32_t use_req_ring;             /* 0: page-scoped rows (the tables are read); 1: request-scoped (they are not) */
  int32_t swa_page_size;            /* positions per state page, >= 1 */
  int32_t ring_size;                /* ring rows per state page (per request with use_req_ring), >= 1 */
  int64_t batch_size;               /* B, 0..2^31-1 */
  const int64_t* req_pool_indices;  /* [B] each request's row of req_to_token */
  const int32_t* req_to_token;      /* [token_rows, token_cols], rows token_stride elements apart: the
                                       full-pool token of each (request row, position); may be null when
                                       use_req_ring or empty */
  int64_t token_rows;
  int64_t token_cols;
  int64_t token_stride;             /* >= 0 */
  const int64_t* full_to_state;     /* [num_full] the state slot of each full-pool token; may be null when
                                       use_req_ring or num_full == 0 */
  int64_t num_full;
  const void* seq_lens;             /* [B] int64 (int32 with seq_lens_int32): lengths with the new tokens */
  const void* extend_lens;          /* extend: [B] int64 (int32 with extend_lens_int32): new tokens */
  int32_t seq_lens_int32;           /* 0 or 1 */
  int32_t extend_lens_int32;        /* 0 or 1 */
  int64_t num_tokens;               /* extend: N, 0..65536 (16-bit ragged rows): the rows of plan_c and plan_w */
  dsa_c4_decode_record* plan_d;     /* decode: [B] written */
  dsa_c4_compress_record* plan_c;   /* extend: [N] written */
  dsa_c4_write_record* plan_w;      /* extend: [N] written */
} dsa_c4_plan_params;

DSA_API dsa_status dsa_c4_plan_decode(const dsa_c4_plan_params* params, void* stream);
DSA_API dsa_status dsa_c4_plan_extend(const dsa_c4_plan_params* params, void* stream);
/* The offline c128 compressor (docs/spec.md, "The offline c128 compressor").
 *
 * A token's input row is fp32 [kv | score] (2 D); chunk n of a request closes at position 128n + 127 and is,
 * per channel, the softmax over its 128 positions j of score + ape[j] (ape fp32 [128, D]) weighting kv. A store
 * uses rotary row 128n (= seq_len - 128 at the closing token).
 *
 * State: a ring of raw input rows, [ring_rows, 2D] fp32 or bf16 (rounded to nearest even), ring_rows a
 * multiple of 128, seen as pages of 128 rows (the row of position p within its page is p % 128). Where a
 * position lives is the caller's choice, passed in the c4 record formats with a group of 128 rows (a page):
 *   decode record   {u32 seq_len (with the new token; 0 padding), i32 write row, i32 unused, i32 page of the
 *                   new token's chunk}
 *   compress record {u32 seq_len = closing position + 1, u16 ragged row of the closing token, u16 window rows
 *                   read from the ring (rows 0 .. ring_rows - 1 of the page; the others are input rows
 *                   ragged - 127 + j), i32 unused, i32 page}
 *   write record    {u32 ragged row, i32 ring row}
 * or pydsa's request-scoped ring: request slot s owns rows s*R .. s*R+R-1 (R = ring_size, a multiple of 128),
 * position p at row s*R + p % R.
 *
 *   dsa_c128_offline_decode  one new token per request: its row is written to the ring; when seq_len % 128 == 0
 *                            the chunk's entry is computed from the page's 128 ring rows (the new one as
 *                            written: a bf16 ring rounds it), written to `out` and stored. One launch.
 *   dsa_c128_offline_extend  new tokens at ragged rows: every compress record closes a chunk (`out` row i for
 *                            record i), then every write record copies an input row into the ring. Two
 *                            launches: every ring read of the call precedes every ring write.
 *
 * Records and slots are data: a record whose rows lie outside the ring or the input is skipped and counted
 * in error_count (a decode row whose write row is good but whose page is not still writes its row); padding
 * records (seq_len or ragged row 0xFFFFFFFF, decode seq_len 0) and, in the request-scoped decode, a negative
 * slot or a seq_len <= 0 are skipped silently. On the GPU the ops need sm_90 (thread-block clusters). */

typedef struct dsa_c128_offline_params {
  uint32_t struct_size;
  uint32_t flags;                 /* DSA_FLAG_PDL; extend: DSA_FLAG_HOST_PLAN (host backend only: the records
                                     are checked before anything runs and one that does not fit fails the
                                     call, naming it) */
  int32_t device;                 /* CUDA ordinal owning every pointer, or DSA_DEVICE_HOST */
  int32_t head_dim;               /* D: 128, 256 or 512 */
  int32_t ring_dtype;             /* dsa_state_dtype of the ring */
  int32_t ring_size;              /* R of the request-scoped decode (seq_lens and slots): a multiple of 128
                                     dividing ring_rows; rows in 64 bits, a slot past the ring skipped and
                                     counted */
  void* ring;                     /* [ring_rows, 2D] of ring_dtype, read and written */
  int64_t ring_rows;              /* rows of `ring`, a multiple of 128 */
  const float* kv_score;          /* decode [B, 2D], extend [num_tokens, 2D] */
  const float* ape;               /* [128, D] */
  float* out;                     /* decode [B, D] (closing rows written), extend [num_compress, D] (row i for
                                     record i); may be null */
  int64_t batch_size;             /* decode: requests (0: nothing runs; inputs may be null) */
  int64_t num_tokens;             /* extend: rows of kv_score (<= 65536: 16-bit ragged rows) */
  const dsa_c4_decode_record* decode_records; /* decode: [B], or null: seq_lens and slots */
  const dsa_c4_compress_record* compress;     /* extend: [num_compress] (may be null when it is 0) */
  const dsa_c4_write_record* write;           /* extend: [num_write] (may be null when it is 0) */
  int64_t num_compress;
  int64_t num_write;
  const int32_t* seq_lens;        /* decode without records: [B] length with the new token (<= 0 padding);
                                     otherwise null */
  const int32_t* slots;           /* decode without records: [B] request slot (negative: not held here; live
                                     slots distinct); otherwise null */
  const dsa_kv_cache* store;      /* host memory, read during the call; null: no store */
  const int64_t* cache_slots;     /* with a store: decode [B], extend [num_tokens] (ragged rows); read at
                                     closing rows; -1: not stored here */
  uint32_t* error_count;          /* [1] incremented per skipped record; may be null */
} dsa_c128_offline_params;

DSA_API dsa_status dsa_c128_offline_decode(const dsa_c128_offline_params* params, void* stream);
DSA_API dsa_status dsa_c128_offline_extend(const dsa_c128_offline_params* params, void* stream);

/* ------------------------------------------------------------------------------------------ */
/* Speculative decoding (docs/spec.md, speculative decoding).
 *
 * The bank: slots of the state buffer itself (so it has the state's dtype), V + 1 entries per
 * request. Entry j of request b (0 <= j <= V) is slot bank_indices[b] + j * bank_stride and holds
 * the state after the first j drafts, when seq + j is not a multiple of 128 (a chunk end leaves
 * nothing to keep). Entry 0 is the state before the drafts: the verify copies it there from
 * indices[b] unless the two are one slot. Bytes per layer: B * (V + 1) * 3 * D * sizeof(state).
 *
 * An engine's step (every slot array int32 on the device, nothing read back to the host):
 *   dsa_c128_verify   per c128 layer: drafts through the decode arithmetic, bank written, main
 *                     slots never written, out rows of chunk-closing drafts written;
 *   (sampling: accepted [B] on the device)
 *   dsa_c128_commit   once per step for every layer (slots are numbered alike in every layer's
 *                     buffer): load_indices[b] = the slot holding the state after seq + a_b
 *                     tokens. The next verify takes it as `indices`, the next decode or prefill as
 *                     `load_indices`: no state is copied. Or, with `states`, the accepted entry of
 *                     every listed layer is copied onto indices[b] in one launch (main slots stay
 *                     current).
 * Within a request, reads precede writes channel by channel, so indices[b] may be an entry of
 * the request's own bank (the previous step's accepted one). Requests must not share slots.
 * A negative slot means "not held on this GPU": the request is skipped silently; a slot at or
 * past num_slots is skipped and counted in error_count. */

typedef struct dsa_c128_verify_params {
  uint32_t struct_size;
  uint32_t flags;               /* DSA_FLAG_PDL */
  int32_t device;               /* CUDA ordinal owning every pointer, or DSA_DEVICE_HOST */
  int32_t head_dim;             /* D */
  int64_t num_slots;            /* rows of `state` (main slots and banks) */
  int64_t batch_size;           /* B >= 0 */
  int32_t num_drafts;           /* V, 1..DSA_MAX_DRAFTS: rows per request in kv_score and out */
  int32_t state_dtype;          /* dsa_state_dtype; the bank has the same */
  void* state;                  /* [num_slots, 1, 3D]: load slots read, bank entries written */
  const float* kv_score;        /* [B * V, 2D]: draft j of request b at row b * V + j */
  float* out;                   /* [B * V, D]: the vector of a chunk closed by draft j at row b * V + j;
                                   other rows untouched; may be null (no vectors written) */
  const float* ape;             /* [128, D] */
  const int32_t* seq_lens;      /* [B] committed length before the drafts; < 0 is padding, 0 a request
                                   with no committed tokens */
  const int32_t* verify_lens;   /* [B] drafts of each request, 0..V (others: skipped, counted);
                                   null: V for every request */
  const int32_t* indices;       /* [B] slot holding the state after seq tokens (read only when seq is
                                   not a multiple of 128); never written */
  const int32_t* bank_indices;  /* [B] slot of bank entry 0 */
  int64_t bank_stride;          /* slots between a request's consecutive bank entries, >= 1 */
  uint32_t* error_count;        /* [1] incremented per skipped request; may be null */
  const dsa_kv_cache* store;   /* host memory, read during the call; null: no store */
  const int64_t* cache_slots;  /* [B * V] cache slot of the vector closed at each row (read only for rows that close a
                                  chunk); required with `store` */
} dsa_c128_verify_params;

typedef struct dsa_c128_commit_params {
  uint32_t struct_size;
  uint32_t flags;               /* DSA_FLAG_PDL */
  int32_t device;               /* CUDA ordinal owning every pointer, or DSA_DEVICE_HOST */
  int32_t head_dim;             /* D (copying commit only) */
  int64_t num_slots;            /* rows of every state buffer */
  int64_t batch_size;           /* B >= 0 */
  int32_t num_drafts;           /* V, 1..DSA_MAX_DRAFTS */
  int32_t state_dtype;          /* dsa_state_dtype (copying commit only) */
  const int32_t* seq_lens;      /* [B] committed length before the drafts, as given to the verify;
                                   < 0 is padding: nothing read or written */
  const int32_t* accepted;      /* [B] drafts accepted, clamped to 0..v_b */
  const int32_t* verify_lens;   /* [B] as given to the verify; null: V */
  const int32_t* indices;       /* [B] as given to the verify (the copying commit's destination) */
  const int32_t* bank_indices;  /* [B] as given to the verify */
  int64_t bank_stride;          /* as given to the verify */
  int32_t* load_indices;        /* [B] written: the slot holding the state after seq + a_b tokens
                                   (indices[b] when that is a chunk end: the next token starts fresh);
                                   may be `indices` itself. Null for a copying commit */
  int32_t num_layers;           /* 0, or the state buffers of a copying commit, 1..: one launch per
                                   DSA_COMMIT_LAYERS */
  int32_t reserved;             /* 0 */
  void* const* states;          /* [num_layers] host array of state buffers [num_slots, 1, 3D] alike;
                                   null unless copying */
  uint32_t* error_count;        /* [1] incremented once per skipped request; may be null */
} dsa_c128_commit_params;

DSA_API dsa_status dsa_c128_verify(const dsa_c128_verify_params* params, void* stream);
DSA_API dsa_status dsa_c128_commit(const dsa_c128_commit_params* params, void* stream);

/* ------------------------------------------------------------------------------------------ */
/* Fused DSA metadata copy (docs/spec.md, metadata copy). All buffers int32.                                        */

typedef enum dsa_forward_mode {
  DSA_MODE_DECODE = 0,
  DSA_MODE_TARGET_VERIFY = 1,
  DSA_MODE_DRAFT_EXTEND = 2
} dsa_forward_mode;

typedef struct dsa_metadata_sources {
  const int32_t* cache_seqlens;       /* [bs] */
  const int32_t* cu_seqlens_k;        /* [bs + 1]; elements 1..bs+1 are copied */
  const int32_t* page_indices;        /* [page_rows, page_width] dense */
  const int32_t* seqlens_expanded;    /* [expanded] ; null in DECODE */
  const int32_t* dsa_cache_seqlens;   /* [n], n = bs (DECODE) or expanded */
  const int32_t* dsa_cu_seqlens_k;    /* [n + 1]; elements 1..n+1 are copied */
  const int32_t* real_page_table;     /* [page_rows, real_cols] dense; null: group absent */
  const int32_t* num_splits;          /* [n + 1] FlashMLA; null: group absent */
  const int32_t* flashmla_metadata;   /* [metadata_size] FlashMLA; null iff num_splits null */
} dsa_metadata_sources;

/* One backend's static buffers and their capacities (elements). */
typedef struct dsa_metadata_destination {
  int32_t* cache_seqlens;      int64_t cache_seqlens_len;
  int32_t* cu_seqlens_k;       int64_t cu_seqlens_k_len;
  int32_t* page_table;         int64_t page_table_rows; int64_t page_table_cols;
  int64_t page_table_stride;   /* elements between rows, >= page_table_cols */
  int32_t* seqlens_expanded;   int64_t seqlens_expanded_len;   /* may be null in DECODE */
  int32_t* dsa_cache_seqlens;  int64_t dsa_cache_seqlens_len;
  int32_t* dsa_cu_seqlens_k;   int64_t dsa_cu_seqlens_k_len;
  int32_t* real_page_table;    int64_t real_page_table_rows; int64_t real_page_table_cols;
  int64_t real_page_table_stride;
  int32_t* num_splits;         int64_t num_splits_len;
  int32_t* flashmla_metadata;  int64_t flashmla_metadata_len;
} dsa_metadata_destination;

typedef struct dsa_metadata_copy_params {
  uint32_t struct_size;
  uint32_t flags;               /* DSA_FLAG_* */
  int32_t device;               /* CUDA ordinal owning every pointer, or DSA_DEVICE_HOST */
  int32_t mode;                 /* dsa_forward_mode */
  int64_t bs;                   /* requests; 0 is a no-op */
  int64_t page_rows;            /* rows of page_indices (DECODE: must equal bs) */
  int64_t page_width;           /* DECODE: max_len; else max_seqlen_k */
  int64_t expanded;             /* size of seqlens_expanded (TARGET_VERIFY / DRAFT_EXTEND) */
  int64_t real_cols;            /* columns of real_page_table (when present) */
  int64_t metadata_size;        /* elements of flashmla_metadata (when present) */
  dsa_metadata_sources src;
  int32_t num_destinations;     /* K, 1..DSA_MAX_DESTINATIONS */
  int32_t reserved;
  const dsa_metadata_destination* destinations; /* [K] host array */
} dsa_metadata_copy_params;

DSA_API dsa_status dsa_metadata_copy(const dsa_metadata_copy_params* params, void* stream);

/* ------------------------------------------------------------------------------------------ */
/* The request and segment records (docs/spec.md, records): one
 * launch writes a step's 16-byte records, with the slots resolved from req_pool_indices, and the
 * per-request slots the kernels read.
 *   decode record b:  {u32 seq_lens[b], i32 rid + offset, i32 rid + offset, i32 -1}
 *   prefill record:   {u32 position + 1, u32 ragged_id | window_len << 16, i32 rid + offset, i32 rid}
 *                     (rid = req_pool_indices[batch_id]); rows past the records up to compress_rows /
 *                     write_rows (CUDA-graph padding): {0xFFFFFFFF, 0, -1, -1}
 *   slots[b] = rid + offset (may be null for a decode plan: pydsa's decode reads the records in
 *   place with DSA_FLAG_DECODE_RECORDS); load_slots[b] = rid (prefill; may be null); decode:
 *   seq_lens_out[b] = seq_lens[b] (may be null).
 * A prefill's records are host memory read during the call (they travel inside the launch, as in
 * dsa_c128_upload_plan); a record whose batch_id is not below batch_size, whose ragged row does not
 * fit 16 bits or whose window is not 1..128 fails the call before anything is written. */
typedef enum dsa_records_kind { DSA_RECORDS_DECODE = 0, DSA_RECORDS_PREFILL = 1 } dsa_records_kind;

typedef struct dsa_request_records_params {
  uint32_t struct_size;
  uint32_t flags;                   /* DSA_FLAG_PDL */
  int32_t device;                   /* CUDA ordinal owning every pointer but the records, or DSA_DEVICE_HOST */
  int32_t kind;                     /* dsa_records_kind */
  int64_t batch_size;               /* B >= 0 */
  int64_t state_slot_offset;        /* >= 0 */
  const int64_t* req_pool_indices;  /* [B] */
  int32_t* slots;                   /* [B] out: rid + offset (decode: may be null) */
  int32_t* load_slots;              /* [B] out: rid (prefill; may be null) */
  const int64_t* seq_lens;          /* decode: [B] */
  uint8_t* plan_d;                  /* decode: [B, 16] out */
  int32_t* seq_lens_out;            /* decode: [B] out (may be null) */
  const dsa_segment* compress;      /* prefill: [num_compress] host */
  const dsa_segment* write;         /* prefill: [num_write] host */
  int64_t num_compress;
  int64_t num_write;
  uint8_t* plan_c;                  /* prefill: [compress_rows, 16] out */
  uint8_t* plan_w;                  /* prefill: [write_rows, 16] out */
  int64_t compress_rows;            /* >= num_compress */
  int64_t write_rows;               /* >= num_write */
  /* [1] incremented per decode seq_len outside 0..INT32_MAX (a value the 32-bit record would
   * wrap); that request's record is written as padding (seq_len 0). May be null. */
  uint32_t* error_count;
} dsa_request_records_params;

DSA_API dsa_status dsa_request_records(const dsa_request_records_params* params, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* DSA_KERNELS_H */
