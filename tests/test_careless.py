"""A careless-input trial over the public ops, the planners, KVCache, the metadata copy and pydsa.sglang's online
and MTP calls: every argument of a valid call, replaced in turn by what a careless caller passes (None, a list, a
string, a float, the wrong dtype, a wrong shape, a transposed view, a bool for an int, a negative int), meets a
pydsa.ArgumentError (a TypeError or ValueError; sglang's RuntimeError for a wrong dtype in its calls) that names that
argument, and nothing runs: the call's outputs stay as they were. Host backend (the checks are the same code for both
backends)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import pydsa
import pyplan

D = 512
B = 3


def _i32(*v):
    return torch.tensor(v, dtype=torch.int32)


def _decode():
    return dict(state=torch.rand(8, 1, 3 * D), kv_score=torch.randn(B, 2 * D), out=torch.full((B, D), 7.0),
                ape=torch.randn(128, D), indices=_i32(0, 1, 2), seq_lens=_i32(5, 128, 300))


def _prefill():
    seq, ext = np.array([300, 130]), np.array([300, 129])
    return dict(state=torch.rand(4, 1, 3 * D), kv_score=torch.randn(429, 2 * D), out=torch.full((429, D), 7.0),
                ape=torch.randn(128, D), indices=_i32(0, 1), plan=pyplan.plan_prefill(seq, ext))


def _verify():
    return dict(state=torch.rand(16, 1, 3 * D), kv_score=torch.randn(B * 2, 2 * D), out=torch.full((B * 2, D), 7.0),
                ape=torch.randn(128, D), indices=_i32(0, 1, 2), seq_lens=_i32(5, 127, 300), bank_indices=_i32(3, 6, 9),
                bank_stride=1)


def _cache():
    return pydsa.KVCache(torch.zeros(8, pydsa.kv_page_bytes(D, 2), dtype=torch.uint8), torch.rand(D) + 0.5,
                         torch.randn(1024, 64), page_size=2)


def _store():
    return dict(vectors=torch.randn(B, D), positions=_i32(0, 128, 256), cache_slots=torch.arange(B),
                cache=_cache())


def _c4():
    rot = torch.randn(1024, 64)
    main = pydsa.C4Compressor(torch.randn(B * 8, 4 * D), torch.randn(8, D), ring_size=8, store=pydsa.KVCache(
        torch.zeros(4, pydsa.kv_page_bytes(D, 64), dtype=torch.uint8), torch.rand(D) + 0.5, rot, page_size=64))
    indexer = pydsa.C4Compressor(torch.randn(B * 8, 512), torch.randn(8, 128), ring_size=8, store=pydsa.KVCache(
        torch.zeros(4, pydsa.indexer_page_bytes(128, 64), dtype=torch.uint8), torch.rand(128) + 0.5, rot,
        page_size=64, layout="indexer"))
    return dict(main=main, kv_score=torch.randn(B, 4 * D), indexer=indexer, indexer_kv_score=torch.randn(B, 512),
                seq_lens=_i32(4, 9, 16), slots=_i32(0, 1, 2), ring_size=8, cache_slots=torch.arange(B),
                out=torch.full((B, D), 7.0))


def _c4_extend():
    args = _c4()
    for k in ("seq_lens", "slots", "ring_size"):
        del args[k]
    compress, write = pyplan.plan_c4(np.array([6, 12, 9]), np.array([2, 5, 3]), np.array([0, 1, 2]), 8)
    n = 10
    args.update(kv_score=torch.randn(n, 4 * D), indexer_kv_score=torch.randn(n, 512), cache_slots=torch.arange(n),
                plan=(torch.from_numpy(compress), torch.from_numpy(write)), out=torch.full((len(compress), D), 7.0))
    return args


def _c4_verify():
    args = _c4()
    V = 2
    del args["kv_score"], args["indexer_kv_score"]
    args.update(drafts=torch.randn(B * V, 4 * D), indexer_drafts=torch.randn(B * V, 512), num_drafts=V,
                seq_lens=_i32(2, 7, 14), cache_slots=torch.arange(B * V), out=torch.full((B * V, D), 7.0))
    return args


def _commit():
    return dict(seq_lens=_i32(5, 127, 300), accepted=_i32(1, 0, 2), indices=_i32(0, 1, 2), bank_indices=_i32(3, 6, 9),
                num_drafts=2, bank_stride=1, load_indices=torch.full((B,), -7, dtype=torch.int32), num_slots=16)


def _plan():
    return dict(seq_lens=np.array([300, 130]), extend_lens=np.array([300, 129]), num_tokens=429)


def _plan_c4():
    return dict(seq_lens=np.array([6, 12, 9]), extend_lens=np.array([2, 5, 3]), slots=np.array([0, 1, 2]), ring_size=8)


def _kv_cache():
    return dict(cache=torch.zeros(8, pydsa.kv_page_bytes(D, 2), dtype=torch.uint8), norm_weight=torch.rand(D) + 0.5,
                rotary=torch.randn(1024, 64), page_size=2, eps=1e-6)


OPS = {"c4_decode": (lambda main, kv_score, **kw: pydsa.c4_decode(main, kv_score, **kw), _c4, "out"),
       "c4_extend": (lambda main, kv_score, plan, **kw: pydsa.c4_extend(main, kv_score, plan, **kw), _c4_extend, "out"),
       "c4_verify": (lambda main, drafts, seq_lens, slots, **kw: pydsa.c4_verify(main, drafts, seq_lens, slots, **kw),
                     _c4_verify, "out"),
       "c128_commit": (pydsa.c128_commit, _commit, "load_indices"),
       "plan_prefill": (pyplan.plan_prefill, _plan, None), "plan_c4": (pyplan.plan_c4, _plan_c4, None),
       "KVCache": (pydsa.KVCache, _kv_cache, None),
       "c128_decode": (pydsa.c128_decode, _decode, "out"), "c128_prefill": (pydsa.c128_prefill, _prefill, "out"),
       "c128_verify": (pydsa.c128_verify, _verify, "out"), "kv_store": (pydsa.kv_store, _store, None)}

CARELESS = {
    "None": lambda t: None,
    "a list": lambda t: t.tolist() if isinstance(t, torch.Tensor) else [t],
    "a string": lambda t: "x",
    "a float": lambda t: 1.5,
    "float64": lambda t: t.double() if isinstance(t, torch.Tensor) else None,
    "int64": lambda t: t.long() if isinstance(t, torch.Tensor) else None,
    "one row short": lambda t: t[:-1] if isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[0] > 1 else None,
    "a transposed view": lambda t: t.t() if isinstance(t, torch.Tensor) and t.dim() == 2 else None,
    "a bool": lambda t: True,
    "negative": lambda t: -1 if isinstance(t, int) and not isinstance(t, bool) else None,
}
# sglang's compress_forward (c4 and offline c128 branches): mutations taken as valid. A ring one row short (its
# records are data: skipped and counted); ape of another float dtype (cast, as sglang casts it); no out (one is
# made). (Another positive head_dim or compress_ratio is another configuration, handed back to sglang by a
# NotImplementedError; a negative one is no configuration and is refused by name.)
COMPRESS_FORWARD_VALID = {("kv_score_buffer", "one row short"), ("ape", "float64"), ("out", "None")}


def compress_forward_cases(call):
    """(mode, argument, mutation) of every careless compress_forward call `call(mode)`'s arguments give that
    must be refused."""
    for mode in ("decode", "extend"):
        for arg, value in call(mode).items():
            for how, bad in CARELESS.items():
                if (arg, how) in COMPRESS_FORWARD_VALID or (how != "None" and bad(value) is None):
                    continue
                yield mode, arg, how


# Arguments that may be None, and mutations a call may take as valid.
OPTIONAL = {("plan_prefill", "num_tokens"), ("KVCache", "eps"),
            ("c4_decode", "out"), ("c4_decode", "cache_slots"), ("c4_extend", "out"), ("c4_extend", "cache_slots"),
            ("c4_verify", "out"), ("c4_verify", "cache_slots"), ("c4_decode", "ring_size"), ("c4_verify", "ring_size"), ("c128_decode", "out"), ("c128_prefill", "out"), ("c128_verify", "out"), ("c128_decode", "seq_lens")}


def _applies(op, arg, how) -> bool:
    """Whether mutation `how` of `arg` makes a call that must be refused (not a valid call, nor one that does
    not apply to the argument's kind)."""
    value = OPS[op][1]()[arg]
    if how == "None":
        return (op, arg) not in OPTIONAL
    if CARELESS[how](value) is None:
        return False
    # valid calls: a plan may be a list; fewer state slots, cache pages or rotary rows are valid; eps may be any
    # positive float
    valid = ((how == "int64" and arg == "cache_slots") or (how == "a list" and arg == "plan")
             or (how == "one row short" and arg in ("state", "cache", "rotary"))
             or (op == "KVCache" and arg == "eps" and how == "a float"))
    return not valid


def _cases():
    for op, (_, make, _) in OPS.items():
        for arg in make():
            for how in CARELESS:
                if _applies(op, arg, how):
                    yield op, arg, how


@pytest.mark.parametrize("op,arg,how", list(_cases()))
def test_a_careless_argument_is_refused_by_name_and_nothing_runs(op, arg, how):
    fn, make, written = OPS[op]
    args = make()
    bad = CARELESS[how](args[arg])
    args[arg] = bad
    before = args[written].clone() if written and isinstance(args.get(written), torch.Tensor) else None
    if (op, arg, how) == ("c128_prefill", "indices", "one row short"):
        # the plan's records are judged by the library: the error names the record that does not fit
        with pytest.raises(pydsa.DsaError, match="compress record 2 .* does not fit this call"):
            fn(**args)
        assert torch.equal(args[written], before)
        return
    with pytest.raises((TypeError, ValueError)) as caught:
        fn(**args)
    err = caught.value
    assert isinstance(err, pydsa.ArgumentError), f"{type(err).__name__}: {err}"
    # the error names the argument (the records carry indices' place when seq_lens is gone)
    named = {arg} | ({"indices"} if (op, arg) == ("c128_decode", "seq_lens") else set())
    # a size one argument sets for others (kv_score's rows, ...): shortened, the first argument that disagrees is
    # named, and its message says where the size it expected comes from
    assert err.argument.split(" ")[0].split("[")[0] in named or f"of {arg}" in str(err), (err.argument, str(err))
    if before is not None:
        assert torch.equal(args[written], before), "a refused call wrote its output"


def test_the_trial_reaches_every_argument_of_every_op():
    reached = {(op, arg) for op, arg, _ in _cases()}
    assert reached == {(op, arg) for op, (_, make, _) in OPS.items() for arg in make()}


def _metadata_cases():
    from test_metadata import make_case
    for mode in ("decode", "target_verify"):
        src, _ = make_case(torch.device("cpu"), mode, 5, 16, 9, 6, 40, 2, 1, 0)
        for arg, t in src.items():
            for how, bad in CARELESS.items():
                if how in ("negative",) or (how != "None" and bad(t) is None):
                    continue
                if arg == "flashmla_metadata" and how == "one row short":
                    continue  # any length: it is copied flat, as long as the sources say
                yield mode, arg, how


@pytest.mark.parametrize("mode,arg,how", list(_metadata_cases()))
def test_a_careless_metadata_source_is_refused_by_name_and_nothing_is_written(mode, arg, how):
    """The metadata copy's per-step sources, each replaced in turn (one bound copy per case, the other
    sources valid): a pydsa.ArgumentError naming the source, or, for one that sets a size (cache_seqlens,
    seqlens_expanded, page_indices), naming the first that disagrees and saying where the size comes from;
    every destination untouched."""
    from test_metadata import make_case
    src, dsts = make_case(torch.device("cpu"), mode, 5, 16, 9, 6, 40, 2, 1, 0)
    copy = pydsa.MetadataCopy(dsts, mode=mode)
    before = [{k: t.clone() for k, t in d.items()} for d in dsts]
    src[arg] = CARELESS[how](src[arg])
    with pytest.raises((TypeError, ValueError)) as caught:
        copy(**src)
    err = caught.value
    assert isinstance(err, pydsa.ArgumentError), f"{type(err).__name__}: {err}"
    assert arg in err.argument or f"of {arg}" in str(err), (err.argument, str(err))
    assert all(torch.equal(d[k], b[k]) for d, b in zip(dsts, before) for k in d)


def test_sglang_online_calls_refuse_in_sglangs_words():
    """pydsa.sglang's c128_online_decode / c128_online_prefill (sglang's argument names over pydsa's ops) name
    the argument as their caller spelled it."""
    from pydsa import sglang
    args = _decode()
    cases = [("kv_score_buffer", dict(kv_score_buffer=None)), ("kv_score_input", dict(kv_score_input=args["kv_score"].double()))]
    for name, bad in cases:
        call = dict(kv_score_buffer=args["state"], kv_score_input=args["kv_score"], out=args["out"], ape=args["ape"],
                    indices=args["indices"], seq_lens=args["seq_lens"])
        call.update(bad)
        with pytest.raises(pydsa.ArgumentError) as caught:
            sglang.c128_online_decode(**call)
        assert caught.value.argument == name and str(caught.value).startswith(name), str(caught.value)
    p = _prefill()
    with pytest.raises(pydsa.ArgumentError) as caught:
        sglang.c128_online_prefill(p["state"], p["kv_score"], p["out"], p["ape"], p["indices"], "x",
                                   torch.zeros(1, 16, dtype=torch.uint8))
    assert caught.value.argument == "compress_plan", str(caught.value)


def _mtp_calls():
    from pydsa import sglang

    def i64(*v):
        return torch.tensor(v, dtype=torch.int64)

    def write_prefix():
        return dict(kv_score_input=torch.randn(4, 2 * D), seq_lens=i64(5, 9), req_pool_indices=i64(0, 1),
                    req_to_token=torch.zeros(2, 64, dtype=torch.int32), ape=torch.randn(128, D),
                    state=torch.rand(8, 3 * D), batch_size=2, num_verify_tokens=2, state_slot_stride=2)

    def mark():
        return dict(seq_lens=i64(5, 9), req_pool_indices=i64(0, 1), pending_seq_lens=torch.full((4,), 3, dtype=torch.int64),
                    batch_size=2, num_req_slots=4)

    def commit():
        return dict(seq_lens=i64(6, 10), req_pool_indices=i64(0, 1), req_to_token=torch.zeros(2, 64, dtype=torch.int32),
                    pending_seq_lens=i64(5, 9, -1, -1), state=torch.rand(8, 3 * D), batch_size=2,
                    num_verify_tokens=2, state_slot_stride=2, num_req_slots=4)
    return {"online_c128_mtp_write_prefix_states": (sglang.online_c128_mtp_write_prefix_states, write_prefix, "state"),
            "online_c128_mtp_mark_pending": (sglang.online_c128_mtp_mark_pending, mark, "pending_seq_lens"),
            "online_c128_mtp_commit_pending": (sglang.online_c128_mtp_commit_pending, commit, "state")}


def _mtp_cases():
    for op, (_, make, _) in _mtp_calls().items():
        for arg, value in make().items():
            for how, bad in CARELESS.items():
                if how in ("int64", "a transposed view") or (how != "None" and bad(value) is None):
                    continue
                # valid: fewer state rows; req_to_token is unused (as in sglang), any tensor
                if (arg == "state" and how == "one row short") or (arg == "req_to_token" and how in ("float64", "one row short")):
                    continue
                yield op, arg, how


@pytest.mark.parametrize("op,arg,how", list(_mtp_cases()))
def test_a_careless_sglang_mtp_argument_is_refused_by_name_and_nothing_is_written(op, arg, how):
    """pydsa.sglang's MTP calls, each argument replaced in turn: an error naming it in sglang's words (a
    pydsa.ArgumentError, or sglang's RuntimeError for a wrong dtype), and the buffer the call writes untouched."""
    fn, make, written = _mtp_calls()[op]
    args = make()
    args[arg] = CARELESS[how](args[arg])
    before = args[written].clone() if isinstance(args[written], torch.Tensor) else None
    with pytest.raises((TypeError, ValueError, RuntimeError)) as caught:
        fn(**args)
    err = caught.value
    assert isinstance(err, pydsa.ArgumentError) or type(err) is RuntimeError, f"{type(err).__name__}: {err}"
    # named first; a shortened buffer is named in the message of the size it disagrees with
    assert str(err).startswith(arg) or (how == "one row short" and arg in str(err)), str(err)
    if before is not None:
        assert torch.equal(args[written], before)


def _sglang_planners():
    from pydsa.sglang.compress import CompressorDecodePlan, CompressorPrefillPlan

    def c4_prefill():
        return dict(compress_ratio=4, req_pool_indices=torch.tensor([0, 1]), seq_lens=torch.tensor([16, 9]),
                    extend_lens=torch.tensor([6, 9]), req_to_token=torch.arange(1024, dtype=torch.int32).reshape(2, 512),
                    full_to_state=torch.arange(1280), swa_page_size=256, ring_size=8, num_q_tokens=15)

    def c4_decode():
        return dict(compress_ratio=4, req_pool_indices=torch.tensor([0, 1]),
                    req_to_token=torch.arange(1024, dtype=torch.int32).reshape(2, 512), full_to_state=torch.arange(1280),
                    seq_lens=torch.tensor([5, 9]), swa_page_size=256, ring_size=8)

    def online():
        return dict(seq_lens=torch.tensor([300, 130]), extend_lens=torch.tensor([300, 129]),
                    req_pool_indices=torch.tensor([0, 1]), req_to_token=torch.zeros(2, 512, dtype=torch.int32),
                    num_q_tokens=429)
    return {"CompressorPrefillPlan.generate": (CompressorPrefillPlan.generate, c4_prefill),
            "CompressorDecodePlan.generate": (CompressorDecodePlan.generate, c4_decode),
            "CompressorPrefillPlan.generate_online": (CompressorPrefillPlan.generate_online, online)}


def _sglang_planner_cases():
    for op, (_, make) in _sglang_planners().items():
        for arg, value in make().items():
            if arg == "compress_ratio":
                continue  # another ratio is handed back to sglang (NotImplementedError), by design
            for how, bad in CARELESS.items():
                if how in ("int64", "a transposed view") or (how != "None" and bad(value) is None):
                    continue
                # valid: the tables' values are data (rows they cannot address are skipped and counted by the
                # ops); host lengths may be any sequence of ints
                if (arg in ("req_to_token", "full_to_state") and how == "one row short") or (
                        op.endswith("online") and arg in ("seq_lens", "extend_lens") and how == "a list"):
                    continue
                yield op, arg, how


@pytest.mark.parametrize("op,arg,how", list(_sglang_planner_cases()))
def test_a_careless_sglang_planner_argument_is_refused_by_name(op, arg, how):
    """pydsa.sglang's planners (sglang's signatures): a careless argument meets sglang's RuntimeError or a
    pydsa.ArgumentError, naming it (or, shortened, naming it in the message of the size it disagrees with),
    never an internal exception and never an out-of-bounds read."""
    fn, make = _sglang_planners()[op]
    args = make()
    args[arg] = CARELESS[how](args[arg])
    with pytest.raises((TypeError, ValueError, RuntimeError)) as caught:
        fn(**args)
    err = caught.value
    assert isinstance(err, pydsa.ArgumentError) or type(err) is RuntimeError, f"{type(err).__name__}: {err}"
    assert arg in str(err), str(err)


def test_the_arguments_found_by_the_trial_of_2026_12_07_are_named():
    """A verify whose drafts miss batch * num_drafts rows names drafts (not the out sized like it); an extend of
    an empty input over a plan of record tensors names kv_score (each record reads an input row); a planner's uint64
    slot past the int64 range is refused, not wrapped to a negative (padding) slot."""
    m = pydsa.C4Compressor(torch.zeros(64, 4 * D), torch.randn(8, D), ring_size=16)
    out = torch.full((12, D), 7.0)
    with pytest.raises(pydsa.ArgumentValueError, match="drafts has 11 rows") as err:
        pydsa.c4_verify(m, torch.randn(11, 4 * D), _i32(9, 4, 13), _i32(0, 1, 2), num_drafts=4, out=out)
    assert err.value.argument == "drafts" and (out == 7.0).all()
    ring = pydsa.C128Ring(torch.zeros(512, 2 * D), torch.randn(128, D))
    plan = tuple(pyplan.plan_c128_offline(np.array([300]), np.array([300]), np.array([0])).to("cpu"))
    before = ring.ring.clone()
    with pytest.raises(pydsa.ArgumentValueError, match="kv_score has no rows") as err:
        pydsa.c128_offline_extend(ring, torch.empty(0, 2 * D), plan)
    assert err.value.argument == "kv_score" and torch.equal(ring.ring, before)
    c4_plan = tuple(pyplan.plan_c4(np.array([9]), np.array([9]), np.array([0]), 16).to("cpu"))
    with pytest.raises(pydsa.ArgumentValueError, match="kv_score has no rows") as err:
        pydsa.c4_extend(m, torch.empty(0, 4 * D), c4_plan)
    assert err.value.argument == "kv_score"
    for planner in (lambda s: pyplan.plan_c128_offline(np.array([300]), np.array([300]), s),
                    lambda s: pyplan.plan_c4(np.array([9]), np.array([9]), s, 16)):
        with pytest.raises(ValueError, match=r"slots\[0\] is 18446744073709551615") as err:
            planner(np.array([2 ** 64 - 1], np.uint64))
        assert err.value.argument == "slots"


def test_an_out_sharing_memory_with_anything_else_the_call_touches_is_refused_by_name():
    """Each output apart from every buffer of the call, the other compressor's included: the c4 decode's out
    inside the indexer's input, ring or ape, its indexer_out inside main's ring, input, ape or out, and an offline
    c128 out inside the ring's ape, each refused naming the output; nothing written."""
    def c4_parts():
        main = pydsa.C4Compressor(torch.randn(64, 4 * D), torch.randn(8, D), ring_size=16)
        held = torch.randn(B * D)  # the indexer's ape [8, 128] at the start of a buffer an out [B, D] fills
        idx = pydsa.C4Compressor(torch.randn(64, 512), held[:8 * 128].view(8, 128), ring_size=16)
        return main, idx, torch.randn(B, 4 * D), torch.randn(B, 512)
    made = []
    for out_name, where in (("out", lambda m, i, kv, ikv: ikv.view(-1)[:B * D].view(B, D)),
                            ("out", lambda m, i, kv, ikv: i.ring.view(-1)[:B * D].view(B, D)),
                            ("out", lambda m, i, kv, ikv: torch.as_strided(i.ape, (B, D), (D, 1))),
                            ("indexer_out", lambda m, i, kv, ikv: m.ring.view(-1)[:B * 128].view(B, 128)),
                            ("indexer_out", lambda m, i, kv, ikv: kv.view(-1)[:B * 128].view(B, 128)),
                            ("indexer_out", lambda m, i, kv, ikv: m.ape.view(-1)[:B * 128].view(B, 128))):
        main, idx, kv, ikv = c4_parts()
        before = [t.clone() for t in (main.ring, idx.ring, main.ape, idx.ape, kv, ikv)]
        kw = {out_name: where(main, idx, kv, ikv)}
        with pytest.raises(pydsa.ArgumentValueError, match="shares memory") as err:
            pydsa.c4_decode(main, kv, indexer=idx, indexer_kv_score=ikv, seq_lens=_i32(4, 8, 12),
                            slots=_i32(0, 1, 2), **kw)
        assert err.value.argument == out_name
        assert all(torch.equal(a, b) for a, b in zip(before, (main.ring, idx.ring, main.ape, idx.ape, kv, ikv)))
        made.append(out_name)
    main, idx, kv, ikv = c4_parts()
    both = torch.randn(B, D)
    with pytest.raises(pydsa.ArgumentValueError, match="shares memory") as err:
        pydsa.c4_decode(main, kv, indexer=idx, indexer_kv_score=ikv, seq_lens=_i32(4, 8, 12), slots=_i32(0, 1, 2),
                        out=both, indexer_out=both.view(-1)[:B * 128].view(B, 128))
    assert err.value.argument == "indexer_out"
    ape = torch.randn(128, D)
    ring = pydsa.C128Ring(torch.randn(512, 2 * D), ape)
    before = ape.clone()
    with pytest.raises(pydsa.ArgumentValueError, match="out shares memory with ring.ape") as err:
        pydsa.c128_offline_decode(ring, torch.randn(2, 2 * D), seq_lens=_i32(128, 256), slots=_i32(0, 1), out=ape[:2])
    assert err.value.argument == "out" and torch.equal(ape, before)
    assert made == ["out"] * 3 + ["indexer_out"] * 3
