"""A careless-input trial over pydsa.sglang's offline c128 calls (compress_ratio 128, is_online=False): every
argument of a valid compress_forward (decode and extend) and of the fused call's store, replaced in turn by what a
careless caller passes, meets a pydsa.ArgumentError naming that argument in sglang's words (kv_score_buffer,
kv_score_input, ape, plan, out, out_loc, ...), never an internal exception, and nothing is written. Then the
planners' edge cases, one by one, each refused by name (sglang's RuntimeError); and the plugin's routing of an
offline c128 layer and its start-up line. Host backend."""
from __future__ import annotations

import pickle

import pytest
import torch

import pydsa
from pydsa import sglang
from pydsa.sglang import compress as sglang_v2, plugin as sglang_plugin
from sglang_offline_reference import CHUNK, D, Layer, tables
from test_careless import CARELESS, COMPRESS_FORWARD_VALID, compress_forward_cases

REFUSED = (TypeError, ValueError, RuntimeError)


def _refusal(call) -> Exception:
    with pytest.raises(REFUSED) as caught:
        call()
    err = caught.value
    assert isinstance(err, pydsa.ArgumentError) or type(err) is RuntimeError, f"{type(err).__name__}: {err}"
    return err


def _plan(layer, mode):
    rid = torch.tensor([1, 0], dtype=torch.int64)
    if mode == "decode":
        return sglang.CompressorDecodePlan.generate(128, rid, layer.r2t, layer.f2s, torch.tensor([128, 9]), 256, 128), 2
    return sglang.CompressorPrefillPlan.generate(128, rid, torch.tensor([300, 9]), torch.tensor([200, 9]), layer.r2t,
                                                 layer.f2s, 256, 128, 209), 209


def _compress_call(mode: str):
    """A valid offline compress_forward over sglang's plan, its arguments by name."""
    layer = Layer("cpu", reqs=2, seed=1)
    plan, rows = _plan(layer, mode)
    return dict(kv_score_buffer=layer.ring.view(-1, CHUNK, 2 * D), kv_score_input=torch.randn(rows, 2 * D),
                ape=layer.ape, plan=plan, head_dim=D, compress_ratio=CHUNK, out=torch.full((plan[1].shape[0], D), 7.0))


def _compress_cases():
    return compress_forward_cases(_compress_call)


@pytest.mark.parametrize("mode,arg,how", list(_compress_cases()))
def test_a_careless_offline_compress_forward_argument_is_refused_in_sglangs_words(mode, arg, how):
    """The error names the argument as sglang spells it (a shortened decode input too: it disagrees with both the
    plan and out); the ring and out stay as they were."""
    args = _compress_call(mode)
    ring, out = args["kv_score_buffer"].clone(), args["out"].clone()
    kept = args["kv_score_buffer"], args["out"]
    args[arg] = CARELESS[how](args[arg])
    err = _refusal(lambda: sglang.compress_forward(**args, is_online=False))
    assert err.argument == arg and str(err).startswith(arg), (err.argument, str(err))
    assert torch.equal(kept[0], ring) and torch.equal(kept[1], out), "a refused call wrote"


@pytest.mark.parametrize("mode", ["decode", "extend"])
@pytest.mark.parametrize("arg,how", sorted(COMPRESS_FORWARD_VALID))
def test_what_the_trial_takes_as_valid_is_taken(mode, arg, how):
    """The mutations the trial leaves out are not refused: the call runs."""
    args = _compress_call(mode)
    args[arg] = CARELESS[how](args[arg])
    sglang.compress_forward(**args, is_online=False)


@pytest.mark.parametrize("mode", ["decode", "extend"])
@pytest.mark.parametrize("arg,value,handed_back", [("head_dim", 384, True), ("compress_ratio", 8, True),
                                                   ("head_dim", -1, False), ("head_dim", 0, False),
                                                   ("compress_ratio", 0, False), ("compress_ratio", -4, False)])
def test_another_configuration_is_handed_back_and_no_configuration_is_refused(mode, arg, value, handed_back):
    """Another positive head_dim or compress_ratio is another configuration: handed back to sglang with
    NotImplementedError (what the plugin reads as sglang's to run). One no configuration has (zero, negative)
    is the caller's mistake: an ArgumentValueError naming it. Nothing is written either way."""
    args = _compress_call(mode)
    ring, out = args["kv_score_buffer"].clone(), args["out"].clone()
    args[arg] = value
    if handed_back:
        with pytest.raises(NotImplementedError):
            sglang.compress_forward(**args, is_online=False)
    else:
        with pytest.raises(pydsa.ArgumentValueError) as caught:
            sglang.compress_forward(**args, is_online=False)
        assert caught.value.argument == arg and str(caught.value).startswith(arg), str(caught.value)
    assert torch.equal(args["kv_score_buffer"], ring) and torch.equal(args["out"], out), "a refused call wrote"


def test_the_trial_reaches_every_argument_of_compress_forward():
    reached = {arg for _, arg, _ in _compress_cases()}
    assert reached == set(_compress_call("decode"))


@pytest.mark.parametrize("mode", ["decode", "extend"])
@pytest.mark.parametrize("how", ["None", "a list", "float64", "one row short", "a float"])
def test_a_careless_out_loc_of_the_fused_call_is_refused_by_name(mode, how):
    layer = Layer("cpu", reqs=2, seed=1)
    plan, rows = _plan(layer, mode)
    ring, cache = layer.ring.clone(), layer.cache.clone()
    loc = CARELESS[how](torch.arange(rows, dtype=torch.int64))
    err = _refusal(lambda: sglang.compress_forward_and_store(layer.ring, torch.randn(rows, 2 * D), layer.ape, plan,
                                                             **layer.store_args(loc), is_online=False))
    assert err.argument == "out_loc", str(err)
    assert torch.equal(layer.ring, ring) and torch.equal(layer.cache, cache)


def test_a_ring_view_of_other_pages_and_a_head_dim_the_ring_does_not_hold_are_refused():
    call = _compress_call("decode")
    err = _refusal(lambda: sglang.compress_forward(**dict(call, kv_score_buffer=call["kv_score_buffer"].view(
        -1, 64, 2 * D)), is_online=False))
    assert err.argument == "kv_score_buffer" and "[-1, 128, 2D]" in str(err), str(err)
    err = _refusal(lambda: sglang.compress_forward(**dict(call, kv_score_buffer=call["kv_score_buffer"][..., :512]),
                                                   is_online=False))
    assert err.argument == "kv_score_buffer", str(err)
    with pytest.raises(NotImplementedError, match="head_dim 256"):
        sglang.compress_forward(**dict(call, head_dim=256), is_online=False)


def test_an_extend_input_shorter_than_its_plan_is_refused():
    call = _compress_call("extend")
    ring = call["kv_score_buffer"].clone()
    err = _refusal(lambda: sglang.compress_forward(**dict(call, kv_score_input=call["kv_score_input"][:150]),
                                                   is_online=False))
    assert err.argument == "kv_score_input" and "150 rows" in str(err), str(err)
    assert torch.equal(call["kv_score_buffer"], ring)


def _generate(which, **change):
    """A valid decode or prefill planner call with `change` applied, by sglang's argument names."""
    r2t, f2s = tables("cpu", 4)
    if which == "decode":
        args = dict(compress_ratio=128, req_pool_indices=torch.tensor([1, 0]), req_to_token=r2t, full_to_state=f2s,
                    seq_lens=torch.tensor([128, 9]), swa_page_size=256, ring_size=128)
        return sglang_v2.CompressorDecodePlan.generate(**{**args, **change})
    args = dict(compress_ratio=128, req_pool_indices=torch.tensor([1, 0]), seq_lens=torch.tensor([300, 9]),
                extend_lens=torch.tensor([200, 9]), req_to_token=r2t, full_to_state=f2s, swa_page_size=256,
                ring_size=128, num_q_tokens=209)
    return sglang_v2.CompressorPrefillPlan.generate(**{**args, **change})


_PLANNER_EDGES = [
    (dict(ring_size=64), "ring_size"), (dict(ring_size=200), "ring_size"), (dict(ring_size=0), "ring_size"),
    (dict(ring_size=128.0), "ring_size"), (dict(swa_page_size=200), "swa_page_size"),
    (dict(use_req_ring=True), "use_req_ring"), (dict(use_req_ring=1), "use_req_ring"),
    (dict(seq_lens=torch.tensor([128, 2 ** 40])), "seq_lens"), (dict(seq_lens=torch.tensor([1.0, 2.0])), "seq_lens"),
    (dict(seq_lens=torch.tensor([128])), "seq_lens"), (dict(req_to_token=torch.zeros(4, 8)), "req_to_token"),
    (dict(full_to_state=torch.zeros(4, dtype=torch.int32)), "full_to_state"),
    (dict(req_pool_indices=[1, 0]), "req_pool_indices"), (dict(compress_ratio="128"), "compress_ratio"),
]
_PREFILL_EDGES = [
    (dict(extend_lens=torch.tensor([0, 9])), "extend_lens[0]"), (dict(extend_lens=torch.tensor([400, 9])),
                                                                 "extend_lens[0]"),
    (dict(num_q_tokens=210), "num_q_tokens"), (dict(num_q_tokens=209.0), "num_q_tokens"),
    (dict(num_q_tokens=1, seq_lens=torch.tensor([1, 1]), extend_lens=torch.tensor([1, 1])), "num_q_tokens"),
    (dict(num_q_tokens=70000, seq_lens=torch.tensor([70000, 9]), extend_lens=torch.tensor([69991, 9])),
     "num_q_tokens"), (dict(use_cuda_graph="yes"), "use_cuda_graph"),
    (dict(extend_lens=torch.tensor([200, 9], dtype=torch.int16)), "extend_lens"),
]


@pytest.mark.parametrize("which,change,name", [("decode", c, n) for c, n in _PLANNER_EDGES]
                         + [("prefill", c, n) for c, n in _PLANNER_EDGES + _PREFILL_EDGES])
def test_a_careless_planner_argument_is_refused_by_name(which, change, name):
    """Ring sizes that are not a multiple of 128 (sglang's decode planner takes them, and its pages then straddle
    two requests' rings), use_req_ring (a c4 switch), lengths past 32 bits, extends outside 1..seq_len or not
    summing to num_q_tokens, tables of the wrong kind: sglang's RuntimeError naming the argument."""
    err = _refusal(lambda: _generate(which, **change))
    assert name in str(err), str(err)


def test_the_plugin_routes_an_offline_c128_layer_to_pydsa_and_hands_back_what_is_not_pydsas(monkeypatch):
    """sglang's compressor call site (its _forward_compress_all_in_one) for an offline c128 layer: one fused call
    of pydsa's over sglang's plan, the ring and cache those of pydsa.sglang's own call; online (sglang's rule says
    so) it takes pydsa's online path; bf16_store, the fp8 two-pool store, a V4.1 layout or another head_dim go to
    sglang's own code, as does a kv_score_input other than fp32."""
    layer, ref = Layer("cpu", reqs=2, seed=3), Layer("cpu", reqs=2, seed=3)
    plan, _ = _plan(layer, "decode")
    kv, loc = torch.randn(2, 2 * D), torch.tensor([0, 1])
    norm = type("Norm", (), {"weight": layer.weight, "variance_epsilon": 1e-6})()

    class Site:
        def _get_paged_compress_metadata(self, ratio):
            return plan

    kw = dict(kv_score_buffer=layer.ring, kv_score_input=kv, ape=layer.ape.view(-1), head_dim=D, norm=norm,
              freqs_cis_cache=layer.freq, kv_cache=layer.cache, is_indexer=False, rotate=False, compress_ratio=128,
              page_size=2, out_loc=loc)
    theirs = []
    monkeypatch.setattr(sglang_plugin, "_online", lambda ratio: False)
    monkeypatch.delenv(sglang_plugin.OFFLINE_SWITCH, raising=False)  # the default: sglang's own offline layers
    monkeypatch.setattr(sglang_plugin, "_offline", None)  # read again, as register() reads it
    sglang_plugin._compress_all_in_one(lambda self, **k: theirs.append(k), Site(), **kw)
    assert len(theirs) == 1 and torch.equal(layer.ring, ref.ring) and "c128 offline layers" in \
        sglang_plugin.startup_line().split("Handed back")[1]
    theirs.clear()
    monkeypatch.setenv(sglang_plugin.OFFLINE_SWITCH, "1")
    assert sglang_plugin.serves_offline(refresh=True)
    assert sglang_plugin._compress_all_in_one(lambda self, **k: theirs.append(k), Site(), **kw) is None
    sglang.compress_forward_and_store(ref.ring, kv, ref.ape, plan, **ref.store_args(loc), is_online=False)
    assert not theirs and torch.equal(layer.ring, ref.ring) and torch.equal(layer.cache, ref.cache)
    assert not (ref.cache == 0xA5).all()
    for extra in (dict(bf16_store=True), dict(fp8_2buff=True), dict(kv_layout="V41"), dict(head_dim=256),
                  dict(kv_score_input=kv.to(torch.bfloat16))):
        sglang_plugin._compress_all_in_one(lambda self, **k: theirs.append(k), Site(), **{**kw, **extra})
    assert len(theirs) == 5
    monkeypatch.setattr(sglang_plugin, "_online", lambda ratio: True)  # online: an extend plan not made online
    plan, _ = _plan(layer, "extend")
    sglang_plugin._compress_all_in_one(lambda self, **k: theirs.append(k), Site(), **kw)
    assert len(theirs) == 6  # not pydsa's online plan: sglang's own path, as before
    line = sglang_plugin.startup_line()
    assert all(words in line for words in sglang_v2.HANDED_BACK) and "c128 offline" in line.split("Handed back")[0]
    monkeypatch.setenv(sglang_plugin.OFFLINE_SWITCH, "maybe")
    with pytest.raises(ValueError, match="PYDSA_SGLANG_OFFLINE is 'maybe'"):
        sglang_plugin.serves_offline(refresh=True)


@pytest.mark.parametrize("mode", ["decode", "extend"])
def test_an_input_sharing_memory_with_the_ring_is_refused(mode):
    """The ring is written while the input is read: an input over the ring's memory is refused by name, nothing
    written."""
    args = _compress_call(mode)
    rows = args["kv_score_input"].shape[0]
    args["kv_score_input"] = args["kv_score_buffer"].view(-1)[:rows * 2 * D].view(rows, 2 * D)
    ring, out = args["kv_score_buffer"].clone(), args["out"].clone()
    with pytest.raises(pydsa.ArgumentValueError) as caught:
        sglang.compress_forward(**args, is_online=False)
    assert caught.value.argument == "kv_score_input", str(caught.value)
    assert torch.equal(args["kv_score_buffer"], ring) and torch.equal(args["out"], out), "a refused call wrote"


def test_the_layers_memo_of_its_buffers_sees_another_view_and_a_weight_written_in_place():
    """pydsa.sglang keeps one pydsa object per layer's buffers (sglang passes the same ones each step), keyed by
    what pydsa reads of them: a bf16 norm weight written in place is cast anew (the cache bytes change with it); a
    shorter rotary table at the same address is judged anew (its missing row skipped and counted); a view of the
    ring in another layout is refused as on a first call."""
    d = 512
    cache = torch.zeros(8, pydsa.kv_page_bytes(d, 2), dtype=torch.uint8)
    plan = sglang_v2.CompressorDecodePlan.generate(128, torch.tensor([1, 0]), torch.zeros(8, 8, dtype=torch.int32),
                                                   torch.zeros(16, dtype=torch.int64), torch.tensor([128, 256]), 256, 128)
    freq = torch.polar(torch.ones(512, 32), torch.rand(512, 32))
    w = (torch.rand(d) + 0.5).bfloat16()
    kw = dict(norm_eps=1e-6, out_loc=torch.tensor([0, 1]), kvcache=cache, page_size=2)
    kv = torch.randn(2, d)
    sglang_v2.compress_norm_rope_store(kv, plan, norm_weight=w, freq_cis=freq, **kw)
    first = cache.clone()
    w.mul_(3).add_(1)
    sglang_v2.compress_norm_rope_store(kv, plan, norm_weight=w, freq_cis=freq, **kw)
    assert not torch.equal(first, cache)
    pydsa.reset_error_count()
    sglang_v2.compress_norm_rope_store(kv, plan, norm_weight=w, freq_cis=freq[:100], **kw)
    assert pydsa.error_count() == 1  # rotary row 128 is past the table passed
    pydsa.reset_error_count()
    ring, ape, x = torch.randn(1024, 2 * d), torch.randn(128, d), torch.randn(2, 2 * d)
    sglang_v2.compress_forward(ring, x, ape, plan, head_dim=d, compress_ratio=128, is_online=False)
    with pytest.raises(ValueError, match="kv_score_buffer must be contiguous") as err:
        sglang_v2.compress_forward(ring.t(), x, ape, plan, head_dim=d, compress_ratio=128, is_online=False)
    assert err.value.argument == "kv_score_buffer"


def test_request_rows_whose_ring_rows_pass_31_bits_are_counted_never_wrapped_into_request_0s_rows():
    """req_pool_indices 2^25 at R = 128: ring row 2^32 + p, whose low 32 bits (sglang's int32 arithmetic) are
    request 0's row p; 2^57 + 1: a product that wraps 64 bits to request 1's rows. The planners' rows and pages lie
    outside every ring instead, and a decode and an extend over them write nothing and count each record."""
    layer = Layer("cpu", reqs=2, seed=1)
    rid = torch.tensor([2 ** 25, 2 ** 57 + 1], dtype=torch.int64)
    plan_d = sglang.CompressorDecodePlan.generate(128, rid, layer.r2t, layer.f2s, torch.tensor([128, 9]), 256, 128)
    words = plan_d[1].view(torch.int32).reshape(-1, 4)
    assert (words[:, 1:] < 0).all(), words
    plan_p = sglang.CompressorPrefillPlan.generate(128, rid, torch.tensor([300, 9]), torch.tensor([200, 9]),
                                                   layer.r2t, layer.f2s, 256, 128, 209)
    compress, write = plan_p[1].view(torch.int32).reshape(-1, 4), plan_p[2].view(torch.int32).reshape(-1, 2)
    reads = (compress[:, 1] >> 16) > 0
    assert reads.any() and (compress[reads, 2:] < 0).all() and (write[:, 1] < 0).all(), (compress, write)
    for plan, rows in ((plan_d, 2), (plan_p, 209)):
        ring, cache = layer.ring.clone(), layer.cache.clone()
        pydsa.reset_error_count()
        sglang.compress_forward_and_store(layer.ring, torch.randn(rows, 2 * D), layer.ape, plan,
                                          **layer.store_args(torch.arange(rows, dtype=torch.int64)), is_online=False)
        assert pydsa.error_count() > 0
        assert torch.equal(layer.ring, ring) and torch.equal(layer.cache, cache)


@pytest.mark.parametrize("mode", ["decode", "extend"])
def test_a_plan_of_the_other_c128_path_is_refused_by_name(mode):
    """An offline plan (generate) given to the online compress and an online plan (generate_online) given to the
    offline one: both are compress_ratio 128 tuples of the same shape, told apart by the kind pydsa's planners tag
    them with; refused naming plan, nothing written. Plans of different kinds do not copy_ into each other."""
    call = _compress_call(mode)
    ring = call["kv_score_buffer"].clone()
    err = _refusal(lambda: sglang.compress_forward(**call, is_online=True))
    assert err.argument == "plan" and "generate_online" in str(err), str(err)
    # the tag is no field: sglang's own compress_forward passes plan[1:3] on, its two (decode) or two of its fields
    assert len(call["plan"]) == (2 if mode == "decode" else 7) and call["plan"][1:3][-1].dtype == torch.uint8
    seq, rid = torch.tensor([300, 9]), torch.tensor([1, 0], dtype=torch.int64)
    r2t = torch.zeros(2, 512, dtype=torch.int32)
    online = sglang.CompressorDecodePlan.generate_online(seq, rid, r2t) if mode == "decode" else \
        sglang.CompressorPrefillPlan.generate_online(seq, torch.tensor([200, 9]), rid, r2t, 209)
    err = _refusal(lambda: sglang.compress_forward(**dict(call, plan=online), is_online=False))
    assert err.argument == "plan" and "generate_online" in str(err), str(err)
    assert torch.equal(call["kv_score_buffer"], ring)
    with pytest.raises(ValueError, match="same compress ratio and kind"):
        call["plan"].copy_(online)
    for plan in (call["plan"], online):  # the kind survives a pickle
        again = pickle.loads(pickle.dumps(plan))
        assert type(again) is type(plan) and again.online is plan.online and torch.equal(again[1], plan[1])


def test_a_cache_over_the_ring_is_refused_by_name():
    """The fused offline call's kvcache inside its own ring: the store would write the cache while the compress
    reads those rows. Refused naming kvcache, nothing written."""
    layer = Layer("cpu", reqs=2, seed=1)
    plan, rows = _plan(layer, "decode")
    page = pydsa.kv_page_bytes(D, 2)
    over = layer.ring.view(torch.uint8).view(-1)[:4 * page].view(4, page)
    ring = layer.ring.clone()
    err = _refusal(lambda: sglang.compress_forward_and_store(layer.ring, torch.randn(rows, 2 * D), layer.ape, plan,
                                                             **dict(layer.store_args(torch.arange(rows)), kvcache=over),
                                                             is_online=False))
    assert err.argument == "kvcache" and "shares memory with the ring" in str(err), str(err)
    assert torch.equal(layer.ring, ring)


@pytest.mark.parametrize("ratio,which", [(4, "decode"), (4, "prefill"), (128, "decode"), (128, "prefill"),
                                         (128, "decode_online"), (128, "prefill_online")])
def test_a_planner_tensor_on_the_meta_device_is_refused_by_name(ratio, which):
    """A table or length tensor on the meta device (a shape without values) meets sglang's RuntimeError naming it,
    never torch's own error or a plan on the meta device, in every planner (c4, offline and online c128)."""
    r2t, f2s = tables("cpu", 4)
    valid = dict(req_pool_indices=torch.tensor([1, 0]), req_to_token=r2t, full_to_state=f2s,
                 seq_lens=torch.tensor([300, 9]), extend_lens=torch.tensor([200, 9]))
    names = ["req_pool_indices", "seq_lens", "req_to_token"] + (["full_to_state"] if "online" not in which else []) \
        + (["extend_lens"] if which.startswith("prefill") else [])
    for name in names:
        a = dict(valid, **{name: valid[name].to("meta")})
        calls = {
            "decode": lambda: sglang.CompressorDecodePlan.generate(ratio, a["req_pool_indices"], a["req_to_token"],
                                                                   a["full_to_state"], a["seq_lens"], 256,
                                                                   128 if ratio == 128 else 8),
            "prefill": lambda: sglang.CompressorPrefillPlan.generate(
                ratio, a["req_pool_indices"], a["seq_lens"], a["extend_lens"], a["req_to_token"], a["full_to_state"],
                256, 128 if ratio == 128 else 8, 209),
            "decode_online": lambda: sglang.CompressorDecodePlan.generate_online(a["seq_lens"], a["req_pool_indices"],
                                                                                 a["req_to_token"]),
            "prefill_online": lambda: sglang.CompressorPrefillPlan.generate_online(
                a["seq_lens"], a["extend_lens"], a["req_pool_indices"], a["req_to_token"], 209)}
        err = _refusal(calls[which])
        assert type(err) is RuntimeError and name in str(err) and "meta" in str(err), f"{name}: {err}"


def test_an_online_c128_cache_over_its_state_input_or_ape_is_refused_by_name():
    """The online c128 fused call (compress_forward_and_store, is_online=True): a kvcache laid over its own state,
    input or ape would be written while the decode reads them. Refused naming kvcache; the state unchanged."""
    layer = Layer("cpu", reqs=2, seed=1)
    seq, rid = torch.tensor([128, 9]), torch.tensor([1, 0], dtype=torch.int64)
    plan = sglang.CompressorDecodePlan.generate_online(seq, rid, torch.zeros(2, 512, dtype=torch.int32))
    page = pydsa.kv_page_bytes(D, 2)
    state = torch.randn(4, 1, 3 * D)
    kv, ape = torch.randn(2, 2 * D), torch.randn(CHUNK, D)
    for target in (state, kv, ape):
        before = state.clone()
        over = target.view(torch.uint8).view(-1)[:page].view(1, page)
        err = _refusal(lambda: sglang.compress_forward_and_store(
            state, kv, ape, plan, **dict(layer.store_args(torch.arange(2)), kvcache=over)))
        assert err.argument == "kvcache" and "shares memory" in str(err), str(err)
        assert torch.equal(state, before)


@pytest.mark.parametrize("mode", ["decode", "extend"])
def test_an_offline_cache_over_the_calls_input_is_refused_by_name(mode):
    """The fused offline call's kv_score_input inside its kvcache: the store would write the cache while the
    compress reads the input. Refused naming kvcache, nothing written."""
    layer = Layer("cpu", reqs=2, seed=1)
    plan, rows = _plan(layer, mode)
    page = pydsa.kv_page_bytes(D, 2)
    pages = -(-rows * 2 * D * 4 // page)
    room = torch.zeros(pages * page, dtype=torch.uint8)
    kv = room[:rows * 2 * D * 4].view(torch.float32).view(rows, 2 * D)
    kv.copy_(torch.randn(rows, 2 * D))
    ring = layer.ring.clone()
    err = _refusal(lambda: sglang.compress_forward_and_store(
        layer.ring, kv, layer.ape, plan, **dict(layer.store_args(torch.arange(rows)), kvcache=room.view(pages, page)),
        is_online=False))
    assert err.argument == "kvcache" and "kv_score" in str(err), str(err)
    assert torch.equal(layer.ring, ring)


def test_a_store_reading_its_inputs_from_its_own_cache_is_refused_by_name():
    """The standalone store (pydsa.kv_store; sglang's compress_norm_rope_store) reads vectors, positions and slots
    while writing the cache; c128_decode's and the offline ops' cache_slots alike. Each inside the cache: refused
    naming the cache (kvcache in sglang's words), the cache unchanged."""
    page = pydsa.kv_page_bytes(D, 2)
    room = torch.zeros(8 * page, dtype=torch.uint8)
    layer = Layer("cpu", reqs=2, seed=1)
    store = pydsa.KVCache(room, layer.weight, torch.view_as_real(layer.freq).reshape(-1, 64), page_size=2)
    vectors, positions, slots = torch.randn(2, D), torch.tensor([127, 255], dtype=torch.int32), torch.tensor([0, 1])
    inside = {"vectors": room[-2 * D * 4:].view(torch.float32).view(2, D), "positions": room[-8:].view(torch.int32),
              "cache_slots": room[-16:].view(torch.int64)}
    for name, t in inside.items():
        args = dict(vectors=vectors, positions=positions, cache_slots=slots)
        t.copy_(args[name])
        args[name] = t
        before = room.clone()
        with pytest.raises(pydsa.ArgumentValueError, match=f"shares memory with {name}") as caught:
            pydsa.kv_store(args["vectors"], args["positions"], args["cache_slots"], store)
        assert caught.value.argument == "cache" and torch.equal(room, before)
    plan, rows = _plan(layer, "decode")
    kv = room[-rows * D * 4:].view(torch.float32).view(rows, D)
    kv.copy_(torch.randn(rows, D))
    before = room.clone()
    err = _refusal(lambda: sglang.compress_norm_rope_store(kv, plan, **dict(layer.store_args(torch.arange(rows)),
                                                                            kvcache=room.view(8, page))))
    assert err.argument == "kvcache" and torch.equal(room, before), str(err)
    # the offline decode's cache_slots inside its ring's store
    slots_inside = room[-rows * 8:].view(torch.int64)
    slots_inside.copy_(torch.arange(rows))
    before = room.clone()
    err = _refusal(lambda: sglang.compress_forward_and_store(layer.ring, torch.randn(rows, 2 * D), layer.ape, plan,
                                                             **dict(layer.store_args(slots_inside),
                                                                    kvcache=room.view(8, page)), is_online=False))
    assert err.argument == "kvcache" and "cache_slots" in str(err) and torch.equal(room, before), str(err)


def test_a_kvcache_of_more_dimensions_whose_rows_are_not_one_page_is_refused_by_name():
    """[pages, 1, page bytes of page_size 64] passed with page_size 2: the last dimension is judged, not only a 2-D
    cache's rows."""
    layer = Layer("cpu", reqs=2, seed=1)
    plan, rows = _plan(layer, "decode")
    cache = torch.zeros(3, 1, pydsa.kv_page_bytes(D, 64), dtype=torch.uint8)
    err = _refusal(lambda: sglang.compress_norm_rope_store(torch.randn(rows, D), plan, **dict(
        layer.store_args(torch.arange(rows)), kvcache=cache)))
    assert err.argument == "page_size", str(err)
    assert not cache.any()


@pytest.mark.parametrize("ratio,online", [(4, False), (128, False), (128, True)])
def test_num_q_tokens_on_the_meta_device_is_refused_by_name(ratio, online):
    r2t, f2s = tables("cpu", 4)
    n = torch.tensor(209, device="meta")
    seq, ext, rid = torch.tensor([300, 9]), torch.tensor([200, 9]), torch.tensor([1, 0])

    def call():
        if online:
            return sglang.CompressorPrefillPlan.generate_online(seq, ext, rid, r2t, n)
        return sglang.CompressorPrefillPlan.generate(ratio, rid, seq, ext, r2t, f2s, 256, 128 if ratio == 128 else 8, n)
    err = _refusal(call)
    assert "num_q_tokens" in str(err) and "meta" in str(err), str(err)
