// Runs the launch policy (native/src/launch_policy.h) on the host for tests/test_policy.py: one query per
// input line, one answer line each. Pointers are stand-ins whose only property is their alignment.
#include <cstdio>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>

#include "launch_policy.h"

using namespace dsa;

namespace dsa {  // launch_policy.h's checks name these; the queries never fail a check
dsa_status fail(dsa_status status, const char*, ...) { return status; }
dsa_status ok() { return DSA_STATUS_OK; }
}  // namespace dsa

static void* at(int alignment) { return (void*)(uintptr_t)(alignment >= 16 ? 0x10000 : 0x10000 + alignment); }

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string what;
    in >> what;
    if (what == "decode") {  // D B bf16 store alignment sms
      long long b;
      int d, bf16, store, align, sms;
      in >> d >> b >> bf16 >> store >> align >> sms;
      dsa_c128_decode_params p = {};
      dsa_kv_cache cache = {};
      p.head_dim = d, p.batch_size = b, p.state_dtype = bf16 ? DSA_STATE_BFLOAT16 : DSA_STATE_FLOAT32;
      p.state = at(align), p.kv_score = (const float*)at(align), p.out = (float*)at(align), p.ape = (const float*)at(align);
      p.store = store ? &cache : nullptr;
      const DecodeShape s = decode_shape(p, sms);
      std::printf("%d %lld %d %d %d %d %d %d\n", s.vec, (long long)s.shape.grid_x, s.shape.grid_y, s.shape.block_x,
                  s.shape.block_y, (int)s.early_dependents, (int)s.store_ok, (int)s.fits);
    } else if (what == "verify") {  // D B bf16 store alignment
      long long b;
      int d, bf16, store, align;
      in >> d >> b >> bf16 >> store >> align;
      dsa_c128_verify_params p = {};
      dsa_kv_cache cache = {};
      p.head_dim = d, p.batch_size = b, p.state_dtype = bf16 ? DSA_STATE_BFLOAT16 : DSA_STATE_FLOAT32;
      p.state = at(align), p.kv_score = (const float*)at(align), p.out = (float*)at(align), p.ape = (const float*)at(align);
      p.store = store ? &cache : nullptr;
      const VerifyShape s = verify_shape(p);
      std::printf("%d %lld %d %d %d %d %d %d\n", s.vec, (long long)s.shape.grid_x, s.shape.grid_y, s.shape.block_x,
                  s.shape.block_y, (int)s.store_ok, (int)s.fits, verify_draft_batch(s.vec, store != 0));
    } else if (what == "store") {  // D count alignment
      long long n;
      int d, align, vec = 0;
      in >> d >> n >> align;
      const Shape s = store_shape(d, (const float*)at(align), n, &vec);
      std::printf("%d %lld %d %d %d\n", vec, (long long)s.grid_x, s.block_x, s.block_y, (int)s.fits);
    } else if (what == "lanes") {  // records D sms
      long long r;
      int d, sms;
      in >> r >> d >> sms;
      std::printf("%d %d\n", prefill_lanes_log2(r, d, sms), prefill_at_once_lanes(r, d, sms));
    } else if (what == "route") {  // D num_compress num_write num_continuing host_plan cooperative sms
      long long nc, nw, cont;
      int d, host, coop, sms;
      in >> d >> nc >> nw >> cont >> host >> coop >> sms;
      dsa_c128_prefill_params p = {};
      p.head_dim = d, p.flags = host ? DSA_FLAG_HOST_PLAN : 0u;
      const char* names[] = {"at_once", "split", "passes"};
      std::printf("%s\n", names[prefill_route(p, nc, nw, cont, sms, coop != 0)]);
    } else if (what == "c4") {  // D VEC count
      long long n;
      int d, vec;
      in >> d >> vec >> n;
      std::printf("%lld\n", (long long)c4_blocks(d, vec, n));
    } else if (what == "c4vec") {  // count
      long long n;
      in >> n;
      auto first = [](int bytes, bool stores) {
        return (int)C4Form<2>::window_first(bytes, stores) + 2 * (int)C4Form<4>::window_first(bytes, stores);
      };
      std::printf("%d %d %d %d %d\n", c4_channels(n), first(4, true), first(4, false), first(2, true), first(2, false));
    } else if (what == "c4plan") {  // B
      long long b;
      in >> b;
      std::printf("%lld %d\n", (long long)c4_plan_decode_blocks(b), kC4PlanThreads);
    } else if (what == "c4plan_extend") {  // num_tokens
      long long n;
      in >> n;
      std::printf("%lld %d %lld\n", (long long)c4_plan_extend_blocks(n), kC4PlanExtendThreads,
                  (long long)kC4PlanExtendThreads * kC4PlanRequestsPerThread);
    } else if (what == "offline") {  // D count extend
      long long n;
      int d, extend;
      in >> d >> n >> extend;
      const Shape s = offline_shape(d, n, extend != 0);
      std::printf("%lld %d %d %d\n", (long long)s.grid_x, s.block_x, offline_cluster(d, n, extend != 0),
                  s.fits ? 1 : 0);
    } else if (what == "offline_vec") {  // bf16_ring extend -> lanes, threads, loads first, row form's wide sums
      int bf16, extend;
      in >> bf16 >> extend;
      const int vec = offline_slice_vec(bf16 != 0, extend != 0);
      std::printf("%d %d %d %d\n", vec, offline_slice_threads(vec), (int)offline_loads_first(bf16 != 0, extend != 0),
                  (int)offline_row_wide_sums(bf16 != 0, extend != 0));
    } else if (what == "commit") {  // layers alignment bf16
      int layers, align, bf16;
      in >> layers >> align >> bf16;
      void* states[DSA_COMMIT_LAYERS] = {};
      for (int i = 0; i < layers; ++i) states[i] = at(i == layers - 1 ? align : 16);
      dsa_c128_commit_params p = {};
      p.num_layers = layers, p.states = states, p.state_dtype = bf16 ? DSA_STATE_BFLOAT16 : DSA_STATE_FLOAT32;
      std::printf("%d\n", commit_copy_vector_width(p));
    } else if (what == "commitslots") {  // B
      long long b;
      in >> b;
      std::printf("%lld %d\n", (long long)commit_slots_blocks(b), kCommitThreads);
    } else if (what == "upload") {  // records in the launch
      int n;
      in >> n;
      std::printf("%d %d\n", upload_blocks(n), kUploadThreads);
    } else if (what == "records") {  // items
      long long n;
      in >> n;
      std::printf("%lld %d\n", (long long)records_blocks(n), kRecordsThreads);
    } else if (what == "copylarge") {  // small tiles, sms
      long long tiles;
      int sms;
      in >> tiles >> sms;
      std::printf("%d\n", (int)copy_large_tiles(tiles, sms));
    } else if (what == "copy") {  // tiles num_dst large sms
      long long tiles;
      int dst, large, sms;
      in >> tiles >> dst >> large >> sms;
      const CopyShape s = copy_shape(tiles, dst, large != 0, sms);
      const char* forms[] = {"per_destination", "large", "narrow", "small"};
      std::printf("%s %lld %d\n", forms[s.form], (long long)s.grid, s.block);
    } else if (!what.empty()) {
      std::printf("? %s\n", what.c_str());
    }
  }
  return 0;
}
