/* A C99 consumer of libdsa_kernels: plans a prefill, runs c128 prefill, decode, a speculative
 * verify and commit, a KV-cache store and a metadata copy through the host backend on built-in data, checks every result against values computed
 * here, and prints a one-line verdict. Exit status 0 only if every check passed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsa_kernels.h"

#define D 64
#define TOKENS 384 /* three chunks: 300 by prefill, 84 by decode */
#define PREFILL 300

static int failures = 0;

static void expect(int ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "check failed: %s (%s)\n", what, dsa_last_error());
    ++failures;
  }
}

static unsigned lcg = 12345u;
static float next_float(void) { /* uniform in [-2, 2) */
  lcg = lcg * 1664525u + 1013904223u;
  return (float)((lcg >> 8) & 0xFFFF) / 16384.0f - 2.0f;
}

/* The compressed vector of chunk c, in double, straight from the formula. */
static void chunk_reference(const float* rows, const float* ape, int c, double* out) {
  for (int d = 0; d < D; ++d) {
    double m = -INFINITY, s = 0.0, acc = 0.0;
    for (int j = 0; j < DSA_CHUNK; ++j) {
      const double t = rows[(c * DSA_CHUNK + j) * 2 * D + D + d] + ape[j * D + d];
      m = t > m ? t : m;
    }
    for (int j = 0; j < DSA_CHUNK; ++j) {
      const double w = exp(rows[(c * DSA_CHUNK + j) * 2 * D + D + d] + ape[j * D + d] - m);
      s += w;
      acc += w * rows[(c * DSA_CHUNK + j) * 2 * D + d];
    }
    out[d] = acc / s;
  }
}

static double relative_error(const float* got, const double* want) {
  double num = 0.0, den = 0.0;
  for (int d = 0; d < D; ++d) {
    num += (got[d] - want[d]) * (got[d] - want[d]);
    den += want[d] * want[d];
  }
  return sqrt(num / den);
}

/* Plain-mode plan of `batch` requests into caller-owned record arrays. */
static dsa_plan_params plan_params(const int64_t* seq, const int64_t* ext, int64_t batch, int64_t tokens,
                                   dsa_segment* compress, int64_t compress_capacity, dsa_segment* write,
                                   int64_t write_capacity, int64_t* nc, int64_t* nw) {
  dsa_plan_params p;
  memset(&p, 0, sizeof p);
  p.struct_size = sizeof p;
  p.batch_size = batch;
  p.num_tokens = tokens;
  p.seq_lens = seq;
  p.extend_lens = ext;
  p.compress = compress;
  p.write = write;
  p.compress_capacity = compress_capacity;
  p.write_capacity = write_capacity;
  p.num_compress = nc;
  p.num_write = nw;
  return p;
}

static void check_plan(void) {
  const int64_t seq[2] = {300, 50}, ext[2] = {200, 50};
  dsa_segment compress[8], write[8];
  int64_t nc = -1, nw = -1;
  dsa_plan_params p = plan_params(seq, ext, 2, 250, compress, 8, write, 8, &nc, &nw);
  expect(dsa_c128_plan_prefill(&p) == DSA_STATUS_OK, "plan");
  /* Expected records, cut here position by position. */
  int64_t c = 0, w = 0, ragged = 0;
  for (int b = 0; b < 2; ++b) {
    int64_t start = seq[b] - ext[b];
    for (int64_t pos = seq[b] - ext[b]; pos < seq[b]; ++pos) {
      const int closes = pos % DSA_CHUNK == DSA_CHUNK - 1;
      if (!closes && pos != seq[b] - 1) continue;
      const dsa_segment* got = closes ? &compress[c++] : &write[w++];
      expect(got->ragged_id == (uint32_t)(ragged + pos - (seq[b] - ext[b])) && got->batch_id == (uint32_t)b &&
                 got->position == (uint32_t)pos && got->window_len == (uint32_t)(pos - start + 1),
             "plan record");
      start = pos + 1;
    }
    ragged += ext[b];
  }
  expect(nc == c && nw == w, "plan counts");
  p.compress_capacity = 1;
  expect(dsa_c128_plan_prefill(&p) == DSA_STATUS_CAPACITY, "too small a capacity is refused");
}

static void check_c128(void) {
  static float rows[TOKENS * 2 * D], ape[DSA_CHUNK * D], state[2 * 3 * D], out[TOKENS * D];
  for (int i = 0; i < TOKENS * 2 * D; ++i) rows[i] = next_float();
  for (int i = 0; i < DSA_CHUNK * D; ++i) ape[i] = next_float();
  for (int i = 0; i < 2 * 3 * D; ++i) state[i] = 1e30f; /* stale: must never be read */
  for (int i = 0; i < TOKENS * D; ++i) out[i] = NAN;

  /* Prefill 300 tokens of one request (slot 1) from position 0. */
  const int64_t seq = PREFILL, ext = PREFILL;
  dsa_segment compress[4], write[2];
  int64_t nc = 0, nw = 0;
  dsa_plan_params plan = plan_params(&seq, &ext, 1, PREFILL, compress, 4, write, 2, &nc, &nw);
  expect(dsa_c128_plan_prefill(&plan) == DSA_STATUS_OK && nc == 2 && nw == 1, "prefill plan");

  /* The plan into a plan buffer that a captured prefill would read (on a GPU: device memory, the
   * records carried by the upload's launch; here the host backend's memory). */
  dsa_segment held_compress[4], held_write[2];
  int64_t held_counts[2] = {-1, -1};
  dsa_plan_upload_params up;
  memset(&up, 0, sizeof up);
  up.struct_size = sizeof up;
  up.device = DSA_DEVICE_HOST;
  up.compress = compress;
  up.write = write;
  up.num_compress = nc;
  up.num_write = nw;
  up.device_compress = held_compress;
  up.device_write = held_write;
  up.compress_capacity = 4;
  up.write_capacity = 2;
  up.device_counts = held_counts;
  expect(dsa_c128_upload_plan(&up, NULL) == DSA_STATUS_OK && held_counts[0] == 2 && held_counts[1] == 1 &&
             memcmp(held_compress, compress, 2 * sizeof(dsa_segment)) == 0 &&
             memcmp(held_write, write, sizeof(dsa_segment)) == 0,
         "plan upload");
  up.num_compress = 5;
  expect(dsa_c128_upload_plan(&up, NULL) == DSA_STATUS_CAPACITY, "an upload over capacity is refused");

  const int32_t slot = 1;
  dsa_c128_prefill_params p;
  memset(&p, 0, sizeof p);
  p.struct_size = sizeof p;
  p.device = DSA_DEVICE_HOST;
  p.head_dim = D;
  p.num_slots = 2;
  p.batch_size = 1;
  p.num_tokens = PREFILL;
  p.state = state;
  p.kv_score = rows;
  p.out = out;
  p.ape = ape;
  p.indices = &slot;
  p.compress = compress;
  p.write = write;
  p.compress_capacity = nc;
  p.write_capacity = nw;
  expect(dsa_c128_prefill(&p, NULL) == DSA_STATUS_OK, "prefill");

  double want[D];
  for (int c = 0; c < 2; ++c) {
    chunk_reference(rows, ape, c, want);
    expect(relative_error(&out[(c * DSA_CHUNK + DSA_CHUNK - 1) * D], want) < 1e-5, "prefill chunk vector");
  }
  /* The same prefill with compact output: row i holds compress record i's vector. */
  static float compact[2 * D];
  p.out = compact;
  p.out_layout = DSA_OUT_COMPACT;
  expect(dsa_c128_prefill(&p, NULL) == DSA_STATUS_OK, "compact prefill");
  for (int c = 0; c < 2; ++c)
    expect(memcmp(&compact[c * D], &out[(c * DSA_CHUNK + DSA_CHUNK - 1) * D], D * sizeof(float)) == 0,
           "compact row equals the ragged row");
  /* Decode the rest of chunk 2 one token at a time; the last one closes it. */
  float decoded[D];
  for (int pos = PREFILL; pos < TOKENS; ++pos) {
    const int32_t seq_len = pos + 1;
    for (int d = 0; d < D; ++d) decoded[d] = NAN;
    dsa_c128_decode_params q;
    memset(&q, 0, sizeof q);
    q.struct_size = sizeof q;
    q.device = DSA_DEVICE_HOST;
    q.head_dim = D;
    q.num_slots = 2;
    q.batch_size = 1;
    q.state = state;
    q.kv_score = &rows[pos * 2 * D];
    q.out = decoded;
    q.ape = ape;
    q.indices = &slot;
    q.seq_lens = &seq_len;
    expect(dsa_c128_decode(&q, NULL) == DSA_STATUS_OK, "decode");
  }
  chunk_reference(rows, ape, 2, want);
  expect(relative_error(decoded, want) < 1e-5, "decode chunk vector");
  for (int i = 0; i < 3 * D; ++i) expect(state[i] == 1e30f, "slot 0 untouched");

  dsa_c128_decode_params bad;
  memset(&bad, 0, sizeof bad);
  bad.struct_size = sizeof bad - 4;
  expect(dsa_c128_decode(&bad, NULL) == DSA_STATUS_ABI_MISMATCH, "a wrong struct_size is refused");
}

/* One plain decode of token `pos` (row `row`) from slot `load` into slot `store`. */
static dsa_status decode_one(float* state, int64_t slots, const float* row, const float* ape, int32_t store,
                             int32_t load, int32_t pos, float* out) {
  const int32_t seq_len = pos + 1;
  dsa_c128_decode_params q;
  memset(&q, 0, sizeof q);
  q.struct_size = sizeof q;
  q.device = DSA_DEVICE_HOST;
  q.head_dim = D;
  q.num_slots = slots;
  q.batch_size = 1;
  q.state = state;
  q.kv_score = row;
  q.out = out;
  q.ape = ape;
  q.indices = &store;
  q.load_indices = &load;
  q.seq_lens = &seq_len;
  return dsa_c128_decode(&q, NULL);
}

/* Speculative step: V drafts from position 125 (the third one closes the chunk), 5 accepted. The
 * state after the commit must equal five plain decodes of the accepted drafts, bit for bit.
 * Slots: 0 the request's main slot, 1 the plain-decode twin, 2.. the bank (V + 1 entries). */
static void check_speculative(void) {
  enum { V = 8, START = 125, ACCEPT = 5, SLOTS = 2 + V + 1 };
  static float rows[(START + V) * 2 * D], ape[DSA_CHUNK * D], state[SLOTS * 3 * D], out[V * D], twin_out[D];
  for (int i = 0; i < (START + V) * 2 * D; ++i) rows[i] = next_float();
  for (int i = 0; i < DSA_CHUNK * D; ++i) ape[i] = next_float();
  for (int i = 0; i < SLOTS * 3 * D; ++i) state[i] = 1e30f;
  for (int pos = 0; pos < START; ++pos)
    for (int32_t slot = 0; slot < 2; ++slot)
      expect(decode_one(state, SLOTS, &rows[pos * 2 * D], ape, slot, slot, pos, twin_out) == DSA_STATUS_OK, "decode");
  for (int i = 0; i < V * D; ++i) out[i] = NAN;
  const int32_t seq = START, main_slot = 0, bank = 2, accepted = ACCEPT;
  dsa_c128_verify_params v;
  memset(&v, 0, sizeof v);
  v.struct_size = sizeof v;
  v.device = DSA_DEVICE_HOST;
  v.head_dim = D;
  v.num_slots = SLOTS;
  v.batch_size = 1;
  v.num_drafts = V;
  v.state = state;
  v.kv_score = &rows[START * 2 * D];
  v.out = out;
  v.ape = ape;
  v.seq_lens = &seq;
  v.indices = &main_slot;
  v.bank_indices = &bank;
  v.bank_stride = 1;
  expect(dsa_c128_verify(&v, NULL) == DSA_STATUS_OK, "verify");
  int32_t load = -7;
  dsa_c128_commit_params c;
  memset(&c, 0, sizeof c);
  c.struct_size = sizeof c;
  c.device = DSA_DEVICE_HOST;
  c.num_slots = SLOTS;
  c.batch_size = 1;
  c.num_drafts = V;
  c.seq_lens = &seq;
  c.accepted = &accepted;
  c.indices = &main_slot;
  c.bank_indices = &bank;
  c.bank_stride = 1;
  c.load_indices = &load;
  expect(dsa_c128_commit(&c, NULL) == DSA_STATUS_OK && load == bank + ACCEPT, "commit resolves bank entry 5");
  for (int j = 0; j < ACCEPT; ++j) {
    expect(decode_one(state, SLOTS, &rows[(START + j) * 2 * D], ape, 1, 1, START + j, twin_out) == DSA_STATUS_OK,
           "twin decode");
    if ((START + j) % DSA_CHUNK == DSA_CHUNK - 1)
      expect(memcmp(&out[j * D], twin_out, D * sizeof(float)) == 0, "the verify's chunk vector equals the decode's");
  }
  expect(memcmp(&state[load * 3 * D], &state[1 * 3 * D], 3 * D * sizeof(float)) == 0,
         "accepted state equals plain decodes");
  /* The copying commit puts the same entry onto the main slot. */
  void* layers[1] = {state};
  c.load_indices = NULL;
  c.num_layers = 1;
  c.head_dim = D;
  c.states = layers;
  expect(dsa_c128_commit(&c, NULL) == DSA_STATUS_OK, "copying commit");
  expect(memcmp(&state[0], &state[1 * 3 * D], 3 * D * sizeof(float)) == 0, "main slot holds the accepted state");
  c.num_layers = 0;
  expect(dsa_c128_commit(&c, NULL) == DSA_STATUS_INVALID_ARGUMENT, "a commit with neither mode is refused");
}

static void check_metadata_copy(void) {
  enum { BS = 3, WIDTH = 5, STRIDE = 8 };
  int32_t cache[BS], cu[BS + 1], pages[BS * WIDTH], dsa_cache[BS], dsa_cu[BS + 1];
  for (int i = 0; i < BS; ++i) cache[i] = 10 + i, dsa_cache[i] = 20 + i;
  for (int i = 0; i <= BS; ++i) cu[i] = 100 * i, dsa_cu[i] = 7 * i;
  for (int i = 0; i < BS * WIDTH; ++i) pages[i] = 1000 + i;
  int32_t d_cache[BS], d_cu[BS + 1], d_pages[BS * STRIDE], d_dsa_cache[BS], d_dsa_cu[BS + 1];
  int32_t* all[] = {d_cache, d_cu, d_pages, d_dsa_cache, d_dsa_cu};
  const int sizes[] = {BS, BS + 1, BS * STRIDE, BS, BS + 1};
  for (int f = 0; f < 5; ++f)
    for (int i = 0; i < sizes[f]; ++i) all[f][i] = -1;

  dsa_metadata_destination dst;
  memset(&dst, 0, sizeof dst);
  dst.cache_seqlens = d_cache, dst.cache_seqlens_len = BS;
  dst.cu_seqlens_k = d_cu, dst.cu_seqlens_k_len = BS + 1;
  dst.page_table = d_pages, dst.page_table_rows = BS, dst.page_table_cols = STRIDE, dst.page_table_stride = STRIDE;
  dst.dsa_cache_seqlens = d_dsa_cache, dst.dsa_cache_seqlens_len = BS;
  dst.dsa_cu_seqlens_k = d_dsa_cu, dst.dsa_cu_seqlens_k_len = BS + 1;
  dsa_metadata_copy_params p;
  memset(&p, 0, sizeof p);
  p.struct_size = sizeof p;
  p.device = DSA_DEVICE_HOST;
  p.mode = DSA_MODE_DECODE;
  p.bs = BS;
  p.page_rows = BS;
  p.page_width = WIDTH;
  p.src.cache_seqlens = cache;
  p.src.cu_seqlens_k = cu;
  p.src.page_indices = pages;
  p.src.dsa_cache_seqlens = dsa_cache;
  p.src.dsa_cu_seqlens_k = dsa_cu;
  p.num_destinations = 1;
  p.destinations = &dst;
  expect(dsa_metadata_copy(&p, NULL) == DSA_STATUS_OK, "metadata copy");
  int ok = d_cu[0] == -1 && d_dsa_cu[0] == -1;
  for (int i = 0; i < BS; ++i)
    ok &= d_cache[i] == cache[i] && d_cu[i + 1] == cu[i + 1] && d_dsa_cache[i] == dsa_cache[i] && d_dsa_cu[i + 1] == dsa_cu[i + 1];
  for (int r = 0; r < BS; ++r)
    for (int c = 0; c < STRIDE; ++c) ok &= d_pages[r * STRIDE + c] == (c < WIDTH ? pages[r * WIDTH + c] : -1);
  expect(ok, "metadata copy contents");
  dst.page_table_cols = WIDTH - 1;
  expect(dsa_metadata_copy(&p, NULL) == DSA_STATUS_CAPACITY, "a source wider than its destination is refused");
}

/* The KV-cache store of a vector of ones with unit weights: y = 1/sqrt(1 + eps) rounds to bf16 1.0, so
 * every group's scale is 2^-8 (exponent byte 119), every fp8 code that of 256 (0x78), and the rope
 * tail rotated by (cos, sin) = (1, 0) stays 1.0 (bf16 0x3F80). Also decoded straight into the cache:
 * a request whose token closes a chunk stores the same entry. */
static void check_store(void) {
  enum { SD = 512, PAGE = 2, PAGES = 2 };
  static float x[SD], w[SD], rotary[4 * 64], ape[DSA_CHUNK * SD], row[2 * SD], state[3 * SD];
  static uint8_t cache[PAGES * 1728];
  expect(dsa_kv_page_bytes(SD, PAGE) == 1728, "page bytes");
  for (int d = 0; d < SD; ++d) x[d] = 1.0f, w[d] = 1.0f, row[d] = 1.0f, row[SD + d] = next_float();
  for (int i = 0; i < 4 * 64; ++i) rotary[i] = (i % 2 == 0) ? 1.0f : 0.0f;
  memset(cache, 0xA5, sizeof cache);
  dsa_kv_cache kc;
  memset(&kc, 0, sizeof kc);
  kc.struct_size = sizeof kc;
  kc.layout = DSA_CACHE_V4;
  kc.cache = cache;
  kc.num_pages = PAGES;
  kc.page_size = PAGE;
  kc.eps = 1e-6f;
  kc.norm_weight = w;
  kc.rotary = rotary;
  kc.num_positions = 4;
  const int64_t slot = 1;
  const int32_t position = 3;
  dsa_kv_store_params p;
  memset(&p, 0, sizeof p);
  p.struct_size = sizeof p;
  p.device = DSA_DEVICE_HOST;
  p.head_dim = SD;
  p.num_vectors = 1;
  p.vectors = x;
  p.positions = &position;
  p.cache_slots = &slot;
  p.cache = &kc;
  expect(dsa_kv_store(&p, NULL) == DSA_STATUS_OK, "kv_store");
  const uint8_t* data = cache + 576; /* page 0, entry 1 */
  const uint8_t* scales = cache + 1152 + 8;
  int ok = 1;
  for (int i = 0; i < 448; ++i) ok = ok && data[i] == 0x78;
  for (int g = 0; g < 7; ++g) ok = ok && scales[g] == 119;
  for (int l = 0; l < 64; ++l) ok = ok && data[448 + 2 * l] == 0x80 && data[448 + 2 * l + 1] == 0x3F;
  expect(ok && scales[7] == 0xA5 && cache[0] == 0xA5, "kv_store bytes");
  /* A decode whose token closes a chunk (seq_len 128) with kv = 1 stores a vector of ones: the same entry. */
  static uint8_t cache2[PAGES * 1728];
  memset(cache2, 0xA5, sizeof cache2);
  kc.cache = cache2;
  for (int i = 0; i < DSA_CHUNK * SD; ++i) ape[i] = 0.0f;
  for (int d = 0; d < SD; ++d) state[d] = 0.0f, state[SD + d] = 1.0f, state[2 * SD + d] = 1.0f;
  const int32_t zero = 0, seq = DSA_CHUNK;
  dsa_c128_decode_params q;
  memset(&q, 0, sizeof q);
  q.struct_size = sizeof q;
  q.device = DSA_DEVICE_HOST;
  q.head_dim = SD;
  q.num_slots = 1;
  q.batch_size = 1;
  q.state = state;
  q.kv_score = row;
  q.ape = ape;
  q.indices = &zero;
  q.seq_lens = &seq;
  q.state_dtype = DSA_STATE_FLOAT32;
  q.store = &kc;
  q.cache_slots = &slot;
  expect(dsa_c128_decode(&q, NULL) == DSA_STATUS_OK, "decode with a store, out null");
  expect(memcmp(cache, cache2, sizeof cache) == 0, "decode's fused store writes kv_store's bytes");
}

/* The c4 decode of one request over a request-scoped ring (D = 128, R = 8): four tokens whose kv halves are
 * all 1 close entry 0, a softmax of ones: every channel 1. Then an out-of-range slot is skipped and counted. */
static void check_c4(void) {
  enum { CD = 128, R = 8 };
  static float ring[R * 4 * CD], rows[4 * CD], ape[8 * CD], out[CD];
  for (int i = 0; i < 4 * CD; ++i) rows[i] = i < 2 * CD ? 1.0f : (float)(i % 7) * 0.25f;
  for (int i = 0; i < 8 * CD; ++i) ape[i] = (float)(i % 5) * 0.1f;
  for (int i = 0; i < CD; ++i) out[i] = -1.0f;
  dsa_c4_params p;
  memset(&p, 0, sizeof p);
  p.struct_size = sizeof p;
  p.device = DSA_DEVICE_HOST;
  p.num_compressors = 1;
  p.ring_dtype = DSA_STATE_FLOAT32;
  p.ring_size = R;
  p.batch_size = 1;
  p.compressors[0].head_dim = CD;
  p.compressors[0].ring = ring;
  p.compressors[0].ring_rows = R;
  p.compressors[0].kv_score = rows;
  p.compressors[0].ape = ape;
  p.compressors[0].out = out;
  const int32_t slot = 0;
  uint32_t errors = 0;
  p.slots = &slot;
  p.error_count = &errors;
  for (int32_t seq = 1; seq <= 4; ++seq) {
    p.seq_lens = &seq;
    expect(dsa_c4_decode(&p, NULL) == DSA_STATUS_OK, "c4 decode");
  }
  int ones = 1;
  for (int d = 0; d < CD; ++d) ones &= out[d] > 0.99999f && out[d] < 1.00001f;
  expect(ones, "c4 entry 0 of kv halves of ones is ones");
  const int32_t bad = 5, seq = 5;
  p.slots = &bad;
  p.seq_lens = &seq;
  expect(dsa_c4_decode(&p, NULL) == DSA_STATUS_OK && errors == 1, "c4 decode counts a slot past the ring");
  p.ring_size = 6;
  expect(dsa_c4_decode(&p, NULL) == DSA_STATUS_INVALID_ARGUMENT && strstr(dsa_last_error(), "ring_size") != NULL,
         "c4 decode names a bad ring_size");
}

int main(void) {
  if (dsa_abi_version() != DSA_ABI_VERSION) {
    printf("dsa_kernels C consumer: FAIL (library ABI %d, header ABI %d)\n", dsa_abi_version(), DSA_ABI_VERSION);
    return 1;
  }
  check_plan();
  check_c128();
  check_speculative();
  check_store();
  check_metadata_copy();
  check_c4();
  printf("dsa_kernels C consumer: %s (library %s, ABI %d, host backend)\n", failures ? "FAIL" : "OK",
         dsa_version_string(), dsa_abi_version());
  return failures ? 1 : 0;
}
