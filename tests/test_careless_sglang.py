"""A careless-input trial over pydsa.sglang's c4 calls and its planners' edge cases: every argument of a valid
compress_forward (c4 decode and extend) and c4_layer call, replaced in turn by what a careless caller passes,
meets a pydsa.ArgumentError naming that argument in sglang's words (kv_score_buffer, kv_score_input, ape, plan,
out_loc, main['store'], ...), never an internal exception, and nothing is written. Then the edge cases one by
one: ring sizes below 8, an extend whose input is shorter than its plan, configuration ints of the wrong type,
lengths past sglang's 32-bit records, flags that are not bools, the online planner's and the MTP commit's names,
an `out` that shares memory with the input. Host backend, except where a test says it needs the GPU."""
from __future__ import annotations

import pytest
import torch

import pydsa
from pydsa import sglang
from pydsa.sglang import compress as sglang_v2
from conftest import DEVICES, gpu
from test_careless import CARELESS, compress_forward_cases
from test_sglang_c4 import SWA, _context

# pydsa.ArgumentError, or sglang's RuntimeError where its planners raise one
REFUSED = (TypeError, ValueError, RuntimeError)


def _refusal(call) -> Exception:
    with pytest.raises(REFUSED) as caught:
        call()
    err = caught.value
    assert isinstance(err, pydsa.ArgumentError) or type(err) is RuntimeError, f"{type(err).__name__}: {err}"
    return err


def _compress_call(mode: str):
    """A valid compress_forward of the main c4 compressor (D = 512) over sglang's plan, its arguments by name."""
    ctx = _context("cpu", 2, 64)
    m = ctx["main"]
    if mode == "decode":
        plan = sglang_v2.CompressorDecodePlan.generate(4, ctx["rpi"], ctx["r2t"], ctx["f2s"], torch.tensor([4, 9]),
                                                       SWA, 8)
        rows, out_rows = 2, 2
    else:
        plan = sglang_v2.CompressorPrefillPlan.generate(4, ctx["rpi"], torch.tensor([16, 9]), torch.tensor([6, 9]),
                                                        ctx["r2t"], ctx["f2s"], SWA, 8, 15)
        rows, out_rows = 15, plan.plan_c.shape[0]
    return dict(kv_score_buffer=m["ring"].view(-1, 4, 2048), kv_score_input=torch.randn(rows, 2048),
                ape=m["ape"].view(-1, 512), plan=plan, head_dim=512, compress_ratio=4,
                out=torch.full((out_rows, 512), 7.0))


def _compress_forward(kv_score_buffer, kv_score_input, ape, plan, **kw):
    return sglang.compress_forward(kv_score_buffer, kv_score_input, ape, plan, is_online=False, **kw)


def _compress_cases():
    return compress_forward_cases(_compress_call)


@pytest.mark.parametrize("mode,arg,how", list(_compress_cases()))
def test_a_careless_c4_compress_forward_argument_is_refused_in_sglangs_words(mode, arg, how):
    """compress_forward's c4 branch: the error names the argument as sglang spells it (a shortened input too: it
    disagrees with both the plan and out, so it is the one named); the ring and out stay as they were."""
    args = _compress_call(mode)
    ring, out = args["kv_score_buffer"].clone(), args["out"].clone()
    kept = args["kv_score_buffer"], args["out"]
    args[arg] = CARELESS[how](args[arg])
    err = _refusal(lambda: _compress_forward(**args))
    assert err.argument == arg and str(err).startswith(arg), (err.argument, str(err))
    assert torch.equal(kept[0], ring) and torch.equal(kept[1], out), "a refused call wrote"


def test_the_trial_reaches_every_argument_of_compress_forward():
    reached = {arg for _, arg, _ in _compress_cases()}
    assert reached == set(_compress_call("decode"))


def _layer_call(mode: str):
    """A valid c4_layer call (both compressors and both stores), its arguments by name."""
    ctx = _context("cpu", 2, 64)
    if mode == "decode":
        plan = sglang_v2.CompressorDecodePlan.generate(4, ctx["rpi"], ctx["r2t"], ctx["f2s"], torch.tensor([4, 9]),
                                                       SWA, 8)
        rows = 2
    else:
        plan = sglang_v2.CompressorPrefillPlan.generate(4, ctx["rpi"], torch.tensor([16, 9]), torch.tensor([6, 9]),
                                                        ctx["r2t"], ctx["f2s"], SWA, 8, 15)
        rows = 15
    sides = {}
    for k in ("main", "indexer"):
        c = ctx[k]
        store = pydsa.KVCache(c["cache"], c["w"], ctx["freqs"], page_size=64,
                              layout="indexer" if k == "indexer" else "v4")
        sides[k] = dict(kv_score_buffer=c["ring"], kv_score_input=torch.randn(rows, 4 * c["d"]), ape=c["ape"],
                        store=store)
    return dict(main=sides["main"], indexer=sides["indexer"], plan=plan,
                out_loc=torch.arange(rows, dtype=torch.int64))


def _layer_cases():
    for mode in ("decode", "extend"):
        call = _layer_call(mode)
        for arg, value in call.items():
            keys = [(arg, key) for key in value] if isinstance(value, dict) else [(arg, None)]
            for side, key in keys:
                target = value if key is None else value[key]
                for how, bad in CARELESS.items():
                    if how != "None" and bad(target) is None:
                        continue
                    # valid: an int64 out_loc is what it is; a compressor without a store, beside one with a store;
                    # fewer ring rows; another float ape (cast)
                    if (key, how) in (("store", "None"), ("kv_score_buffer", "one row short"), ("ape", "float64")) \
                            or (arg, how) == ("out_loc", "int64"):
                        continue
                    yield mode, side, key, how
                if key is not None:
                    yield mode, side, key, "missing"


@pytest.mark.parametrize("mode,arg,key,how", list(_layer_cases()))
def test_a_careless_c4_layer_argument_is_refused_by_its_name_or_key(mode, arg, key, how):
    """c4_layer: a careless argument, or a careless or missing key of its main / indexer dict, meets an error
    naming it (main['store'], indexer['kv_score_input'], plan, out_loc; a shortened decode input names it; a
    shortened indexer input of an extend, whose tokens main's input sets, names it or what it disagrees with);
    no ring or cache byte changes."""
    args = _layer_call(mode)
    buffers = [t for s in ("main", "indexer") for t in (args[s]["kv_score_buffer"], args[s]["store"].cache)]
    before = [t.clone() for t in buffers]
    if key is None:
        args[arg] = CARELESS[how](args[arg])
        name = arg
    else:
        side = dict(args[arg])
        if how == "missing":
            del side[key]
        else:
            side[key] = CARELESS[how](side[key])
        args[arg] = side
        name = f"{arg}[{key!r}]"
    err = _refusal(lambda: sglang.c4_layer(**args))
    if (key, how) == ("kv_score_input", "one row short") and mode == "extend" and arg == "indexer":
        # the main input's rows set the extend's tokens: the first argument that disagrees with them is named
        assert err.argument in ("plan.plan_d", "indexer['kv_score_input']", "main['kv_score_input']", "out_loc"), \
            str(err)
    elif (arg, how) == ("out_loc", "one row short"):
        assert err.argument == "out_loc", str(err)
    else:
        assert err.argument == name and str(err).startswith(name), (err.argument, str(err))
    assert all(torch.equal(t, b) for t, b in zip(buffers, before)), "a refused call wrote"


def test_ring_sizes_below_8_are_refused_by_name():
    """sglang's own planner takes ring_size 4 and its kernels then read overwritten rows; pydsa's refuses it."""
    ctx = _context("cpu", 2, 64, ring_size=8)
    for ring_size in (4, 0, 6):
        err = _refusal(lambda: sglang_v2.CompressorDecodePlan.generate(
            4, ctx["rpi"], ctx["r2t"], ctx["f2s"], torch.tensor([4, 9]), SWA, ring_size))
        assert "ring_size" in str(err) and ">= 8" in str(err), str(err)
        err = _refusal(lambda: sglang_v2.CompressorPrefillPlan.generate(
            4, ctx["rpi"], torch.tensor([16, 9]), torch.tensor([6, 9]), ctx["r2t"], ctx["f2s"], SWA, ring_size, 15))
        assert "ring_size" in str(err) and ">= 8" in str(err), str(err)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("graph", [False, True], ids=["plain", "graph"])
def test_an_extend_input_shorter_than_its_plan_is_refused_not_returned_unwritten(device, graph):
    """compress_forward without `out` over an input missing rows its plan reads: refused, naming
    kv_score_input, the ring untouched (host plans: by the records' rows; device plans: by the plan's row
    count). c4_layer likewise names main['kv_score_input']."""
    ctx = _context(device, 2, 64)
    m = ctx["main"]
    plan = sglang_v2.CompressorPrefillPlan.generate(4, ctx["rpi"], torch.tensor([16, 9]), torch.tensor([6, 9]),
                                                    ctx["r2t"], ctx["f2s"], SWA, 8, 15, use_cuda_graph=graph)
    ring = m["ring"].clone()
    short = 10 if device == "cpu" or graph else 2  # a device plan without padding: its row count (4 here) decides
    kv = torch.randn(short, 2048, device=device)
    err = _refusal(lambda: _compress_forward(m["ring"].view(-1, 4, 2048), kv, m["ape"].view(-1, 512), plan,
                                             head_dim=512, compress_ratio=4))
    assert err.argument == "kv_score_input", str(err)
    assert torch.equal(m["ring"], ring)
    sides = [dict(kv_score_buffer=ctx[k]["ring"], kv_score_input=torch.randn(short, 4 * ctx[k]["d"], device=device),
                  ape=ctx[k]["ape"], store=None) for k in ("main", "indexer")]
    err = _refusal(lambda: sglang.c4_layer(*sides, plan, None))
    assert err.argument == "main['kv_score_input']", str(err)
    assert torch.equal(m["ring"], ring)


def test_configuration_ints_of_another_type_are_refused_as_such():
    """A str compress_ratio or head_dim is a wrong type, not a configuration pydsa does not implement; a page_size
    that is not an int is refused by name, never converted with int(); is_online takes a bool."""
    ctx = _context("cpu", 2, 64)
    for generate, args in ((sglang_v2.CompressorDecodePlan.generate,
                            (ctx["rpi"], ctx["r2t"], ctx["f2s"], torch.tensor([4, 9]), SWA, 8)),
                           (sglang_v2.CompressorPrefillPlan.generate,
                            (ctx["rpi"], torch.tensor([16, 9]), torch.tensor([6, 9]), ctx["r2t"], ctx["f2s"], SWA, 8,
                             15))):
        err = _refusal(lambda: generate("4", *args))
        assert err.argument == "compress_ratio" and "must be an int" in str(err) and "str" in str(err), str(err)
    call = _compress_call("decode")
    for arg, bad in (("head_dim", "512"), ("compress_ratio", "4"), ("is_online", 0)):
        kw = dict(call, is_online=False)
        kw[arg] = bad
        err = _refusal(lambda: sglang.compress_forward(**kw))
        assert err.argument == arg and "must be" in str(err) and type(bad).__name__ in str(err), str(err)
    m = ctx["main"]
    plan = call["plan"]
    for page_size in ("64", 64.7, 64.0):
        store = dict(norm_weight=m["w"], norm_eps=1e-6, freq_cis=ctx["freqs"], kvcache=m["cache"],
                     out_loc=torch.zeros(2, dtype=torch.int64), page_size=page_size)
        err = _refusal(lambda: sglang.compress_norm_rope_store(torch.randn(2, 512), plan, **store))
        assert err.argument == "page_size", str(err)
        err = _refusal(lambda: sglang.compress_forward_and_store(call["kv_score_buffer"], call["kv_score_input"],
                                                                 call["ape"], plan, head_dim=512, compress_ratio=4,
                                                                 **store))
        assert err.argument == "page_size", str(err)
    assert not m["cache"].any(), "a refused store wrote"


def test_a_head_dim_that_disagrees_with_the_ring_is_refused():
    call = _compress_call("decode")
    call["head_dim"] = 128
    err = _refusal(lambda: _compress_forward(**call))
    assert err.argument == "head_dim", str(err)


def test_flags_are_bools():
    """use_req_ring takes a bool in the decode planner as in the prefill planner (use_cuda_graph too)."""
    ctx = _context("cpu", 2, 64)
    err = _refusal(lambda: sglang_v2.CompressorDecodePlan.generate(
        4, ctx["rpi"], ctx["r2t"], ctx["f2s"], torch.tensor([4, 9]), SWA, 8, use_req_ring="yes"))
    assert "use_req_ring" in str(err), str(err)
    for flag in ("use_req_ring", "use_cuda_graph"):
        err = _refusal(lambda: sglang_v2.CompressorPrefillPlan.generate(
            4, ctx["rpi"], torch.tensor([16, 9]), torch.tensor([6, 9]), ctx["r2t"], ctx["f2s"], SWA, 8, 15,
            **{flag: 1}))
        assert flag in str(err), str(err)


def test_a_length_past_32_bits_is_refused_in_a_host_tensor():
    """sglang's records hold a 32-bit seq_len: 2^40 would wrap to a padding record that nothing counts."""
    ctx = _context("cpu", 2, 64)
    err = _refusal(lambda: sglang_v2.CompressorDecodePlan.generate(
        4, ctx["rpi"], ctx["r2t"], ctx["f2s"], torch.tensor([4, 2 ** 40]), SWA, 8))
    assert "seq_lens" in str(err), str(err)
    err = _refusal(lambda: sglang_v2.CompressorPrefillPlan.generate(
        4, ctx["rpi"], torch.tensor([16, 2 ** 40]), torch.tensor([6, 9]), ctx["r2t"], ctx["f2s"], SWA, 8, 15))
    assert "seq_lens" in str(err), str(err)


@gpu
def test_a_length_past_32_bits_in_a_device_tensor_is_a_record_the_op_counts():
    """On the device (no host synchronization), as the online planner does: a record the op skips and counts, not
    a padding record that nothing counts."""
    ctx = _context("cuda", 2, 64)
    plan = sglang_v2.CompressorDecodePlan.generate(4, ctx["rpi"], ctx["r2t"], ctx["f2s"],
                                                   torch.tensor([4, 2 ** 40], device="cuda"), SWA, 8)
    words = plan.plan_d.view(torch.int32).reshape(-1, 4).cpu().tolist()
    assert words[1] == [2 ** 31 - 1, -1, -1, -1], words
    errors = torch.zeros(1, dtype=torch.int32, device="cuda")
    main = pydsa.C4Compressor(ctx["main"]["ring"], ctx["main"]["ape"].reshape(8, 512))
    pydsa.c4_decode(main, torch.randn(2, 2048, device="cuda"), records=plan.plan_d, error_count=errors)
    assert int(errors.item()) == 1


def test_the_online_planner_names_the_plan_buffers_it_was_given():
    """plan_compress_online_prefill's token count is its buffers' rows: buffers that disagree with the extends
    are named (compress_plan), not the planner's num_tokens, which the caller never passed."""
    ext = torch.tensor([10, 20], dtype=torch.int64)
    for rows in (29, 31):
        plans = torch.zeros(rows, 16, dtype=torch.uint8), torch.zeros(rows, 16, dtype=torch.uint8)
        err = _refusal(lambda: sglang.plan_compress_online_prefill(ext, ext, *plans, False))
        assert err.argument == "compress_plan" and str(err).startswith("compress_plan"), str(err)
        assert "num_tokens" not in str(err)


def test_the_mtp_commit_names_num_verify_tokens():
    i64 = lambda *v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
    state = torch.rand(8, 3 * 512)
    before = state.clone()
    err = _refusal(lambda: sglang.online_c128_mtp_commit_pending(
        i64(6, 10), i64(0, 1), torch.zeros(2, 64, dtype=torch.int32), i64(5, 9, -1, -1), state, 2, 40, 2, 4))
    assert err.argument == "num_verify_tokens" and str(err).startswith("num_verify_tokens"), str(err)
    assert torch.equal(state, before)


@pytest.mark.parametrize("mode", ["decode", "extend"])
def test_an_out_sharing_memory_with_the_input_is_refused(mode):
    """As on the c128 path: `out` over kv_score_input's memory would be written while it is read."""
    call = _compress_call(mode)
    rows = call["out"].shape[0]
    call["out"] = call["kv_score_input"].view(-1)[:rows * 512].view(rows, 512)
    before = call["kv_score_input"].clone()
    err = _refusal(lambda: _compress_forward(**call))
    assert err.argument == "out", str(err)
    assert torch.equal(call["kv_score_input"], before)


def test_the_stores_norm_arguments_are_named_as_sglang_spells_them():
    """norm_eps and norm_weight of the storing calls: a norm_eps that is not a number, or is negative or NaN, is
    refused naming norm_eps (not the store's own `eps`); a norm_weight wider than the vectors' D is refused naming
    norm_weight (not kvcache, whose pages it would otherwise be judged against); nothing is written."""
    ctx = _context("cpu", 2, 64)
    m = ctx["main"]
    call = _compress_call("decode")
    plan = call["plan"]

    def store(**kw):
        return dict(dict(norm_weight=m["w"], norm_eps=1e-6, freq_cis=ctx["freqs"], kvcache=m["cache"],
                         out_loc=torch.zeros(2, dtype=torch.int64), page_size=64), **kw)

    def both(**kw):
        yield lambda: sglang.compress_norm_rope_store(torch.randn(2, 512), plan, **store(**kw))
        yield lambda: sglang.compress_forward_and_store(call["kv_score_buffer"], call["kv_score_input"], call["ape"],
                                                        plan, head_dim=512, compress_ratio=4, **store(**kw))
    for bad, kind in ((None, pydsa.ArgumentTypeError), (True, pydsa.ArgumentTypeError),
                      ("x", pydsa.ArgumentTypeError), (-1.0, pydsa.ArgumentValueError),
                      (float("nan"), pydsa.ArgumentValueError)):
        for run in both(norm_eps=bad):
            err = _refusal(run)
            assert isinstance(err, kind) and err.argument == "norm_eps", f"{bad!r}: {type(err).__name__} {err}"
    for run in both(norm_weight=torch.ones(1024)):
        err = _refusal(run)
        assert err.argument == "norm_weight" and "512" in str(err), str(err)
    assert not m["cache"].any(), "a refused store wrote"


@pytest.mark.parametrize("page_size", [2, 4])
def test_a_page_size_whose_pages_tile_the_cache_but_not_its_rows_is_refused(page_size):
    """sglang's c4 caches are [pages, page bytes] (37440 bytes a row for the main cache's 64 entries): a page_size of
    2 or 4 over 3 such rows (3 x 37440 = 65 x 1728 = 39 x 2880 bytes) tiles the same bytes, and would store
    every entry at another place. Refused naming page_size, for the store and the fused call; nothing written."""
    ctx = _context("cpu", 2, 64)
    m = ctx["main"]
    call = _compress_call("decode")
    cache = torch.zeros(3, pydsa.kv_page_bytes(512, 64), dtype=torch.uint8)
    store = dict(norm_weight=m["w"], norm_eps=1e-6, freq_cis=ctx["freqs"], kvcache=cache,
                 out_loc=torch.zeros(2, dtype=torch.int64), page_size=page_size)
    for run in (lambda: sglang.compress_norm_rope_store(torch.randn(2, 512), call["plan"], **store),
                lambda: sglang.compress_forward_and_store(call["kv_score_buffer"], call["kv_score_input"], call["ape"],
                                                          call["plan"], head_dim=512, compress_ratio=4, **store)):
        err = _refusal(run)
        assert err.argument == "page_size" and "37440" in str(err), str(err)
    assert not cache.any()


@pytest.mark.parametrize("mode", ["decode", "extend"])
def test_an_input_sharing_memory_with_a_ring_is_refused(mode):
    """The ring is written while the input is read (by other threads, in no order a caller controls): an input over
    a ring's memory is refused, naming the input, in compress_forward and in c4_layer, where each input must also
    be apart from the other compressor's ring; nothing is written."""
    call = _compress_call(mode)
    rows = call["kv_score_input"].shape[0]
    call["kv_score_input"] = call["kv_score_buffer"].view(-1, 2048)[1:rows + 1]
    ring = call["kv_score_buffer"].clone()
    err = _refusal(lambda: _compress_forward(**call))
    assert err.argument == "kv_score_input" and str(err).startswith("kv_score_input"), str(err)
    assert torch.equal(call["kv_score_buffer"], ring), "a refused call wrote"
    pairs = 0
    for side, over in (("main", "main"), ("indexer", "indexer"), ("main", "indexer"), ("indexer", "main")):
        args = _layer_call(mode)
        width = 4 * (512 if side == "main" else 128)
        ring_over = args[over]["kv_score_buffer"]
        if ring_over.numel() < rows * width:  # the extend's main input does not fit in the indexer's ring
            continue
        pairs += 1
        args[side] = dict(args[side], kv_score_input=ring_over.view(-1)[:rows * width].view(rows, width))
        buffers = [args[s]["kv_score_buffer"] for s in ("main", "indexer")]
        before = [t.clone() for t in buffers]
        err = _refusal(lambda: sglang.c4_layer(**args))
        assert err.argument == f"{side}['kv_score_input']", (side, over, str(err))
        assert all(torch.equal(t, b) for t, b in zip(buffers, before)), "a refused call wrote"
    assert pairs >= 3, pairs


def test_a_ring_of_another_framework_or_dtype_is_named():
    """pydsa.sglang's rings are torch tensors, as sglang's are: a numpy kv_score_buffer is refused by its name (it
    was judged as the ape's shape); in c4_layer, rings of two dtypes name the indexer's ring (it named the
    indexer dict)."""
    for mode in ("decode", "extend"):
        for side in ("main", "indexer"):
            args = _layer_call(mode)
            args[side] = dict(args[side], kv_score_buffer=args[side]["kv_score_buffer"].numpy())
            err = _refusal(lambda: sglang.c4_layer(**args))
            assert err.argument == f"{side}['kv_score_buffer']", str(err)
        args = _layer_call(mode)  # a bf16 ring beside an fp32 one: the indexer's ring is named
        args["indexer"] = dict(args["indexer"], kv_score_buffer=args["indexer"]["kv_score_buffer"].bfloat16())
        err = _refusal(lambda: sglang.c4_layer(**args))
        assert err.argument == "indexer['kv_score_buffer']" and "main['kv_score_buffer']" in str(err), str(err)
        call = _compress_call(mode)
        call["kv_score_buffer"] = call["kv_score_buffer"].numpy()
        err = _refusal(lambda: _compress_forward(**call))
        assert err.argument == "kv_score_buffer", str(err)


def test_a_cache_over_the_ring_or_the_ape_is_refused_by_name():
    """The fused call's kvcache inside its own ring (or ape): the store would write the cache while the compressor
    reads those rows. Refused naming kvcache (main['store'].cache in the one-layer call), nothing written; a
    KVCache's cache over its own norm_weight or rotary table is refused naming cache."""
    ctx = _context("cpu", 2, 64)
    m = ctx["main"]
    call = _compress_call("decode")
    ring, ape = call["kv_score_buffer"], call["ape"]
    for over, page in ((ring.view(torch.uint8).view(-1)[:37440].view(1, 37440), 64),
                       (ape.view(torch.uint8).view(-1)[:1728].view(1, 1728), 2)):
        before = ring.clone(), ape.clone()
        err = _refusal(lambda: sglang.compress_forward_and_store(
            ring, call["kv_score_input"], call["ape"], call["plan"], head_dim=512, compress_ratio=4, norm_weight=m["w"],
            norm_eps=1e-6, freq_cis=ctx["freqs"], kvcache=over, out_loc=torch.zeros(2, dtype=torch.int64),
            page_size=page))
        assert err.argument == "kvcache" and "shares memory" in str(err), str(err)
        assert torch.equal(ring, before[0]) and torch.equal(ape, before[1])
    args = _layer_call("decode")
    main = args["main"]
    args["main"] = dict(main, store=pydsa.KVCache(main["kv_score_buffer"].view(torch.uint8).view(-1)[:37440],
                                                  main["store"].norm_weight, main["store"].rotary, page_size=64))
    err = _refusal(lambda: sglang.c4_layer(**args))
    assert err.argument == "main['store'].cache", str(err)
    weight = torch.zeros(37440 // 4, dtype=torch.float32)
    with pytest.raises(pydsa.ArgumentValueError, match="cache shares memory with norm_weight") as caught:
        pydsa.KVCache(weight.view(torch.uint8), weight[:512], ctx["freqs"], page_size=64)
    assert caught.value.argument == "cache"


@pytest.mark.parametrize("mode", ["decode", "extend"])
def test_one_layers_caches_over_the_other_compressors_buffers_or_each_other_are_refused_by_name(mode):
    """c4_layer runs both compressors and both stores in one launch: main's cache over the indexer's ring, ape or
    input, the indexer's over main's, or the two caches over each other would be written while read (or written
    twice). Each refused naming the cache in the dicts' keys; no ring or cache byte changes."""
    def over(t, page_bytes):
        return t.view(torch.uint8).view(-1)[:page_bytes]

    # (main's cache over the indexer's ape is not among them: 4 KiB, less than a page of main's cache)
    for side, other, key in (("main", "indexer", "kv_score_buffer"), ("main", "indexer", "kv_score_input"),
                             ("indexer", "main", "kv_score_buffer"), ("indexer", "main", "ape"),
                             ("indexer", "main", "kv_score_input"), ("indexer", "main", "store")):
        args = _layer_call(mode)
        s = args[side]["store"]
        target = args[other]["store"].cache if key == "store" else args[other][key]
        need = s.page_bytes
        if key == "kv_score_input":  # the input a view into a buffer the cache covers too (inputs are small)
            size = max(need, target.numel() * 4)
            room = torch.zeros(size, dtype=torch.uint8)
            room[:target.numel() * 4] = target.reshape(-1).view(torch.uint8)
            args[other] = dict(args[other], kv_score_input=room[:target.numel() * 4].view(torch.float32).view(
                target.shape))
            target = room
        assert target.numel() * target.element_size() >= need, (side, key)
        cache = pydsa.KVCache(over(target, need), s.norm_weight, s.rotary, page_size=64,
                              layout="indexer" if side == "indexer" else "v4")
        args[side] = dict(args[side], store=cache)
        buffers = [t for k in ("main", "indexer") for t in (args[k]["kv_score_buffer"], args[k]["store"].cache)]
        before = [t.clone() for t in buffers]
        err = _refusal(lambda: sglang.c4_layer(**args))
        assert err.argument == f"{side}['store'].cache" and "shares memory" in str(err), (side, key, str(err))
        assert all(torch.equal(a, b) for a, b in zip(before, buffers))
