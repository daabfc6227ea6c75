"""sglang 0.5.23's ratio-4 (c4) compressor calls over pydsa's c4 ops (docs/spec.md, "The ratio-4 compressor").

sglang keeps one ring of R raw rows per 256-token SWA page: the row of position p of request rid is
(swa // S) * R + swa % R with swa = full_to_state[req_to_token[rid, p]] (S = swa_page_size), or
rid * R + p % R with use_req_ring. Its plans are the c4 records pydsa's kernels read in place:
- decode: plan_d uint8 [B, 16], {u32 seq_len, i32 write row, i32 previous group, i32 current group};
- extend: plan_c uint8 [C, 16], {u32 seq_len = position + 1, u16 ragged row, u16 window rows from the ring,
  i32 previous group, i32 current group} and plan_w uint8 [W, 8], {u32 ragged row, i32 ring row}; padding
  {0xFFFFFFFF, 0, 0, -1, -1} and {0xFFFFFFFF, -1} (CUDA-graph plans are padded to num_q_tokens rows).

The planners here write the same records as sglang's (its host planner byte for byte; its device planner's
records in request and position order, where sglang's order depends on its atomics). A target verify of V
drafts is an extend of V tokens per request; sglang's ring of 16 rows serves V <= 10 (R - 6), which this
layer cannot check (sglang's signatures do not tell a verify from a prefill): pydsa.c4_verify, which takes
V, refuses more.

Ring sizes below 8 are refused: an entry's window is 8 positions (the previous quartet's A halves and its
own quartet's B halves), so a ring of 4 rows holds one quartet, and the previous one is overwritten before the
entry that closes the next reads it. sglang's own planner takes ring_size 4; its kernels then read an entry's
A halves from the wrong rows wherever the ring supplies them (every decoded entry after the first), silently.

The calls here raise pydsa's argument errors in sglang's words (_args.caller_words): compress_forward's
argument names (compress.py) for `compress`, `c4_layer`'s dict keys (main['kv_score_input'], ...) for
`layer`; the planners raise sglang's RuntimeError, naming the argument.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch

from .. import DEFAULT_PDL_FLAG, check_status as _check_status
from ..c4 import C4Compressor, c4_decode, c4_extend, c4_plan_decode as _decode_plan, c4_plan_extend as _extend_plan
from ..errors import ArgumentError, ArgumentTypeError, ArgumentValueError, bool_argument
from ._args import caller_words, count_of, described as _described

WINDOW, RATIO = 8, 4
MAX_TOKENS = 65536
MAX_SEQ_LEN = 2 ** 31 - 1  # a record's u32 seq_len, read as int32 by the ops


def _check_ring(swa_page_size, ring_size):
    """sglang's ring geometry: ring_size rows per SWA page of swa_page_size tokens. ring_size is at least 8,
    where sglang's own planner takes 4 and its kernels then corrupt (the module's docstring says how)."""
    for name, v in (("swa_page_size", swa_page_size), ("ring_size", ring_size)):
        if count_of(v) is None:
            raise RuntimeError(f"{name} must be an int (got {_described(v)} {v!r})")
    if ring_size < WINDOW or ring_size % RATIO:
        raise RuntimeError(f"ring_size is {ring_size}; expected a multiple of 4, >= 8 (an entry's window is 8 rows; "
                           f"with fewer the ring overwrites rows an entry still reads)")
    if swa_page_size <= 0 or swa_page_size % ring_size:
        raise RuntimeError(f"swa_page_size ({swa_page_size}) must be a positive multiple of ring_size ({ring_size})")


def check_flags(**flags):
    for name, v in flags.items():
        if v is not True and v is not False:
            raise RuntimeError(f"{name} must be a bool (got {_described(v)} {v!r})")


def check_host_lengths(seq):
    """Host seq_lens (int64) fit sglang's 32-bit records (on the device, a length past them becomes a record
    the ops skip and count)."""
    if seq.numel() and int(seq.max()) > MAX_SEQ_LEN:
        bad = int(torch.argmax(seq))
        raise RuntimeError(f"seq_lens[{bad}] is {int(seq[bad])}; expected <= 2^31-1 (sglang's records hold 32-bit "
                           f"lengths)")


def check_data(**tensors):
    """A planner's tensors hold data: one on the meta device (a shape without values) is refused by name."""
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.device.type == "meta":
            raise RuntimeError(f"{name} is on the meta device (a shape without values; the plan reads them)")


def check_tables(req_pool_indices, req_to_token, full_to_state, **lengths):
    """The tables' kinds (their values are data: the plan op never reads past them); none of them, nor the
    lengths given by name, on the meta device."""
    check_data(req_pool_indices=req_pool_indices, req_to_token=req_to_token, full_to_state=full_to_state, **lengths)
    for name, t, dtype, dim in (("req_pool_indices", req_pool_indices, torch.int64, 1),
                                ("req_to_token", req_to_token, torch.int32, 2),
                                ("full_to_state", full_to_state, torch.int64, 1)):
        if not isinstance(t, torch.Tensor) or t.dtype is not dtype or t.dim() != dim:
            raise RuntimeError(f"{name} must be a {dim}-D {dtype} tensor (got {_described(t)})")


def plan_decode(req_pool_indices, req_to_token, full_to_state, seq_lens, swa_page_size: int, ring_size: int,
                use_req_ring: bool = False) -> torch.Tensor:
    """sglang's c4 decode plan (plan_d uint8 [B, 16]) on the device of req_pool_indices, in one launch, no host
    synchronization. A seq_len <= 0 gives a padding record (seq_len 0, nothing read or written); one past
    2^31-1 is refused in a host tensor and in a device tensor becomes a record with ring row -1, which the ops
    skip and count (pydsa.error_count). ring_size >= 8 (the module's docstring says why)."""
    _check_ring(swa_page_size, ring_size)
    check_flags(use_req_ring=use_req_ring)
    check_tables(req_pool_indices, req_to_token, full_to_state, seq_lens=seq_lens)
    if not isinstance(seq_lens, torch.Tensor) or seq_lens.dtype not in (torch.int64, torch.int32):
        raise RuntimeError(f"seq_lens must be a torch.int64/torch.int32 tensor (got {_described(seq_lens)})")
    if req_pool_indices.dim() != 1 or seq_lens.dim() != 1 or req_pool_indices.shape[0] != seq_lens.shape[0]:
        raise RuntimeError(f"req_pool_indices must be [B] with B the length of seq_lens (got "
                           f"{list(req_pool_indices.shape)} and {list(seq_lens.shape)})")
    if seq_lens.device.type == "cpu":
        check_host_lengths(seq_lens.to(torch.int64))
    seq = seq_lens.to(req_pool_indices.device, torch.int64)
    plan_d = torch.empty((seq.shape[0], 16), dtype=torch.uint8, device=seq.device)
    status = _decode_plan(_dense(req_pool_indices), _rows_apart(req_to_token), _dense(full_to_state), _dense(seq),
                          swa_page_size=count_of(swa_page_size), ring_size=count_of(ring_size),
                          use_req_ring=bool(use_req_ring), plan_d=plan_d, flags=DEFAULT_PDL_FLAG)
    if status:
        _check_status(status)
    return plan_d


def plan_prefill(req_pool_indices, seq_lens, extend_lens, req_to_token, full_to_state, swa_page_size: int,
                 ring_size: int, num_q_tokens: int, use_cuda_graph: bool = False, use_req_ring: bool = False):
    """sglang's c4 extend plan (plan_c uint8 [C, 16], plan_w uint8 [W, 8]): with host seq_lens / extend_lens
    (int64), its host planner's records (sum of extends == num_q_tokens); with device ones (CUDA graphs,
    target verify), records in request and position order, both lists padded to num_q_tokens rows. Lengths past
    2^31-1: refused on the host, records the ops skip and count on the device. ring_size >= 8 (the module's
    docstring says why)."""
    _check_ring(swa_page_size, ring_size)
    check_tables(req_pool_indices, req_to_token, full_to_state, seq_lens=seq_lens, extend_lens=extend_lens,
                 num_q_tokens=num_q_tokens)
    for name, t in (("seq_lens", seq_lens), ("extend_lens", extend_lens)):
        if not isinstance(t, torch.Tensor) or t.dtype not in (torch.int64, torch.int32) or t.dim() != 1 \
                or t.shape[0] != req_pool_indices.shape[0]:
            raise RuntimeError(f"{name} must be an int64 or int32 tensor [B] with B the length of req_pool_indices "
                               f"(got {_described(t)}; req_pool_indices {list(req_pool_indices.shape)})")
    check_flags(use_cuda_graph=use_cuda_graph, use_req_ring=use_req_ring)
    n = count_of(num_q_tokens)
    if n is None:
        raise RuntimeError(f"num_q_tokens must be an int (got {_described(num_q_tokens)})")
    dev = req_pool_indices.device
    host = seq_lens.device.type == "cpu"
    seq, ext = seq_lens.to(torch.int64), extend_lens.to(torch.int64)
    b_count = seq.shape[0]
    if not (b_count < MAX_TOKENS and b_count <= n <= MAX_TOKENS):
        raise RuntimeError(f"a c4 prefill plan needs batch_size ({b_count}) <= num_q_tokens ({n}) <= 65536 "
                           f"(16-bit ragged rows)")
    if host:
        check_host_lengths(seq)
        if bool(((ext <= 0) | (ext > seq)).any()):
            bad = int(torch.nonzero((ext <= 0) | (ext > seq))[0, 0])
            raise RuntimeError(f"extend_lens[{bad}] is {int(ext[bad])}; expected 1..seq_lens[{bad}] = {int(seq[bad])}")
        if int(ext.sum()) != n:
            raise RuntimeError(f"the extends sum to {int(ext.sum())} but num_q_tokens is {n}")
    seq_d, ext_d = seq.to(dev), ext.to(dev)
    plan_c = torch.empty((n, 16), dtype=torch.uint8, device=dev)
    plan_w = torch.empty((n, 8), dtype=torch.uint8, device=dev)
    page, ring = count_of(swa_page_size), count_of(ring_size)
    status = _extend_plan(_dense(req_pool_indices), _dense(seq_d), _dense(ext_d), _rows_apart(req_to_token),
                          _dense(full_to_state), swa_page_size=page, ring_size=ring, use_req_ring=use_req_ring,
                          plan_c=plan_c, plan_w=plan_w, flags=DEFAULT_PDL_FLAG)
    if status:
        _check_status(status)
    if host and not use_cuda_graph:  # exactly the real records, counted from the host's lengths
        nc, nw = _host_counts(seq, ext, page, ring, use_req_ring)
        return plan_c[:nc], plan_w[:nw]
    return plan_c, plan_w


def _host_counts(seq: torch.Tensor, ext: torch.Tensor, page: int, ring: int, use_req_ring: bool):
    """(compress, write) records of an extend whose host lengths passed the host planner's checks (0 < ext <=
    seq): the positions p in [seq - ext, seq) with (p + 1) % 4 == 0, and those kept in the ring (p at or past
    the first kept position, or among the last 4 of a page of a page-scoped ring)."""
    start = seq - ext
    closing = int((seq // RATIO - start // RATIO).sum())
    pad = ring - WINDOW + 2 if ring > WINDOW else 0
    first = torch.minimum(seq // RATIO * RATIO - RATIO, seq - pad)
    kept_from = torch.maximum(torch.minimum(first, seq), start)
    kept = seq - kept_from
    if not use_req_ring:  # page ends below kept_from: ends(x) counts the page-end positions below x
        def ends(x):
            return x // page * RATIO + (x % page - (page - RATIO)).clamp_min(0)
        kept = kept + ends(kept_from) - ends(start)
    return closing, int(kept.sum())


def _dense(t: torch.Tensor) -> torch.Tensor:
    """t contiguous, as the op reads it (sglang's own tensors already are)."""
    return t if t.is_contiguous() else t.contiguous()


def _rows_apart(req_to_token: torch.Tensor) -> torch.Tensor:
    """req_to_token with each row contiguous; its rows may lie apart (the op takes their stride)."""
    return req_to_token if req_to_token.shape[1] <= 1 or req_to_token.stride(1) == 1 else req_to_token.contiguous()


def plan_of(plan, ratio=RATIO):
    """plan when it is a plan of compress_ratio `ratio` (sglang's or pydsa.sglang's: its records are read in
    place), else the error naming plan (c4 and offline c128 calls alike)."""
    has = getattr(plan, "compress_ratio", None)
    if not hasattr(plan, "is_decode") or count_of(has) is None:
        raise ArgumentTypeError("plan", f"plan must be a compress_ratio {ratio} CompressorDecodePlan or "
                                        f"CompressorPrefillPlan (got {_described(plan)})")
    if has != ratio:
        raise ArgumentValueError("plan", f"plan is a compress_ratio {has} plan; this call reads compress_ratio "
                                         f"{ratio} records")
    return plan


def as_rows(t, width=None):
    """t viewed as rows of `width` values (default: its last dimension), never copied: sglang's [-1, 4, 4D]
    ring as [rows, 4D], the checkpoint's ape [4, 2D] as [8, D]. Anything that does not view so is passed as
    it is, for the op to judge and name."""
    if not isinstance(t, torch.Tensor) or t.dim() < 1:
        return t
    width = t.shape[-1] if width is None else width
    if t.dim() == 2 and t.shape[1] == width:
        return t
    try:
        return t.view(-1, width)
    except RuntimeError:
        return t


def compressor(kv_score_buffer, ape, store=None) -> C4Compressor:
    """pydsa's view of one sglang c4 compressor: its ring ([rows, 4D] however sglang shapes it), its ape ([8, D]
    or the checkpoint's [4, 2D], cast to fp32 as sglang casts it to its fp32 input) and its store. Raises pydsa's
    errors (ring, ape, store), for the caller to say in its words. The ring is a torch tensor, as sglang's is (an
    array of another framework would leave the ape unviewed and be misjudged as the ape's mistake)."""
    if not isinstance(kv_score_buffer, torch.Tensor):
        raise ArgumentTypeError("ring", f"ring must be a torch.Tensor [rows, 4D] (got {_described(kv_score_buffer)})")
    ring = as_rows(kv_score_buffer)
    d = ring.shape[-1] // 4 if ring.dim() == 2 else None
    if isinstance(ape, torch.Tensor) and ape.is_floating_point() and ape.dtype != torch.float32:
        ape = ape.float()
    return C4Compressor(ring, as_rows(ape, d) if d else ape, store=store)


def entries(kv_score_input, rows_of, head_dim):
    """The fp32 [rows, head_dim] a call without `out` returns, a row per row of `rows_of` (decode: the input;
    extend: the compress records), on the input's device; None when either is not a tensor (the op refuses it
    before anything runs)."""
    if not all(isinstance(t, torch.Tensor) and t.dim() for t in (kv_score_input, rows_of)):
        return None
    return torch.empty((rows_of.shape[0], head_dim), dtype=torch.float32, device=kv_score_input.device)


def input_holds(kv_score_input, plan_c, plan_w, name):
    """An extend's input holds every row its plan reads, or the call is refused, naming the input: a record past
    it would be skipped and counted, its entry never written. Host plans: each record's ragged row. Device
    plans (read by the kernels, not here): the plan's row count, which a plan's records never exceed (one per
    token at most; a CUDA-graph plan has num_q_tokens rows), as sglang's kernel checks it. Tensors of another
    kind are left to the op, which names them."""
    if not (isinstance(kv_score_input, torch.Tensor) and kv_score_input.dim() == 2
            and all(isinstance(t, torch.Tensor) and t.dim() == 2 and t.dtype == torch.uint8
                    for t in (plan_c, plan_w)) and plan_c.shape[1] == 16 and plan_w.shape[1] == 8):
        return
    n = kv_score_input.shape[0]
    if plan_c.device.type != "cpu" or plan_w.device.type != "cpu":
        rows = max(plan_c.shape[0], plan_w.shape[0])
        if n < rows:
            raise ArgumentValueError(name, f"{name} has {n} rows but plan holds {plan_c.shape[0]} compress and "
                                           f"{plan_w.shape[0]} write records (a plan for at least {rows} tokens)")
        return
    c = plan_c.contiguous().view(torch.int32)
    w = plan_w.contiguous().view(torch.int32)
    for which, live, ragged in (("plan.plan_c", c[:, 0] != -1, c[:, 1] & 0xFFFF),
                                ("plan.plan_w", w[:, 0] != -1, w[:, 0].to(torch.int64) & 0xFFFFFFFF)):
        past = torch.nonzero(live & (ragged >= n))
        if past.numel():
            i = int(past[0, 0])
            raise ArgumentValueError(name, f"{name} has {n} rows but {which}'s record {i} reads row {int(ragged[i])} "
                                           f"(a plan made for more tokens)")


def ring_step(ring, kv_score_input, plan, *, head_dim: int, parts: int, decode, extend, out, make: bool, out_loc):
    """One step of a raw ring over sglang's plan (c4: a C4Compressor with c4_decode / c4_extend; offline c128: a
    C128Ring with its ops; `parts`: D-wide parts of a ring row), its store fused when the ring has one; returns
    out (decode [B, D]: closing rows written; extend [C, D]: row i for record i), one of its own when `make`."""
    if ring.head_dim != head_dim:
        raise ArgumentValueError("head_dim", f"head_dim is {head_dim} but kv_score_buffer's rows hold {parts} x "
                                             f"{ring.head_dim} values")
    if plan.is_decode:
        given = out
        if make:
            out = entries(kv_score_input, kv_score_input, head_dim)
        try:
            decode(ring, kv_score_input, records=plan.plan_d, out=out, cache_slots=out_loc)
        except ArgumentError as exc:
            raise input_rows_named(exc, kv_score_input, plan, (given, out_loc)) from None
    else:
        plan_c, plan_w = plan.plan_c, plan.plan_w
        input_holds(kv_score_input, plan_c, plan_w, "kv_score_input")
        if make:
            out = entries(kv_score_input, plan_c, head_dim)
        extend(ring, kv_score_input, (plan_c, plan_w), out=out, cache_slots=out_loc)
    return out


def input_rows_named(exc, kv_score_input, plan, others, name="kv_score"):
    """A decode refused for rows that disagree (the op names the first argument that disagrees with the input's
    rows, which set the batch): when the input alone disagrees with the plan's records and `others` (out,
    out_loc, the other compressor's input: tensors or None), the error names the input instead; else exc. Cold
    path: called only from an except clause."""
    if not (isinstance(exc, ArgumentError) and getattr(plan, "is_decode", False)
            and isinstance(kv_score_input, torch.Tensor) and kv_score_input.dim() >= 1):
        return exc
    b, n = plan.plan_d.shape[0], kv_score_input.shape[0]
    if n == b or any(isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[0] != b for t in others):
        return exc
    return ArgumentValueError(name, f"{name} has {n} rows but plan.plan_d holds {b} records (one row per request)")


def _decode_ahead(*args, **kwargs):
    return c4_decode(*args, records_ahead=True, **kwargs)


def _decode(records_ahead):
    """The decode of a compressor's step: c4_decode, reading sglang's plan (and out_loc) before the wait for the
    launch ahead when the caller promises them made before it began (records_ahead, a bool, refused otherwise:
    an extend would not reach c4_decode's own check)."""
    return _decode_ahead if bool_argument(records_ahead, "records_ahead") else c4_decode


def compress(kv_score_buffer, kv_score_input, ape, plan, head_dim: int, out=None, store=None, out_loc=None, *,
             records_ahead: bool = False):
    """One compressor's c4 step over sglang's plan (decode or extend), its store fused when given; returns out
    (decode [B, D]: closing rows written; extend [C, D]: row i for record i), one of its own when out is None
    and there is no store. Raises pydsa's errors in pydsa's names (compress.py says them in sglang's) and its
    own in sglang's (head_dim, kv_score_input). records_ahead: c4_decode's promise, for the plan and out_loc."""
    plan = plan_of(plan)
    return ring_step(compressor(kv_score_buffer, ape, store), kv_score_input, plan, head_dim=head_dim, parts=4,
                     decode=_decode(records_ahead), extend=c4_extend, out=out, make=out is None and store is None,
                     out_loc=out_loc)


_SIDE_KEYS = ("kv_score_buffer", "kv_score_input", "ape", "store")
# pydsa's argument names -> c4_layer's (its dicts' keys), for the errors pydsa's c4 ops raise
_LAYER_NAMES = {"main": "main", "indexer": "indexer", "kv_score": "main['kv_score_input']",
                "indexer_kv_score": "indexer['kv_score_input']", "records": "plan.plan_d", "plan[0]": "plan.plan_c",
                "plan[1]": "plan.plan_w", "cache_slots": "out_loc", "main.store.cache": "main['store'].cache",
                "indexer.store.cache": "indexer['store'].cache"}


def _side(name: str, side) -> C4Compressor:
    """The compressor of c4_layer's `main` or `indexer` dict, its errors in the dict's keys."""
    if not isinstance(side, Mapping):
        raise ArgumentTypeError(name, f"{name} must be a dict of {', '.join(_SIDE_KEYS)} (got {_described(side)})")
    for key in _SIDE_KEYS:
        if key not in side:
            raise ArgumentValueError(f"{name}[{key!r}]", f"{name}[{key!r}] is missing: {name} must hold "
                                                         f"{', '.join(_SIDE_KEYS)} (store: a pydsa.KVCache or None)")
    try:
        return compressor(side["kv_score_buffer"], side["ape"], side["store"])
    except ArgumentError as exc:
        raise caller_words(exc, {"ring": f"{name}['kv_score_buffer']", "ape": f"{name}['ape']",
                                 "store": f"{name}['store']", "store.cache": f"{name}['store'].cache"}) from None


def layer(main, indexer, plan, out_loc, *, records_ahead: bool = False) -> None:
    """Both compressors of one c4 layer and both stores in one call (decode: one launch; extend: two). main
    and indexer: dicts of kv_score_buffer, kv_score_input, ape and store (a pydsa.KVCache, layout "v4" for
    main, "indexer" for the indexer; or None); out_loc: sglang's c4_out_loc. Errors name the dicts' keys
    (main['kv_score_input'], ...), plan and out_loc. records_ahead=True: the caller's promise that the plan
    and out_loc were written before the launch ahead of this call began (sglang's step metadata, made at the
    step's start: the plugin makes it when out_loc is the step's own c4_out_loc); the decode then reads them
    before waiting for that launch."""
    decode = _decode(records_ahead)
    m, i = _side("main", main), _side("indexer", indexer)
    plan = plan_of(plan)
    kv, indexer_kv = main["kv_score_input"], indexer["kv_score_input"]
    try:
        if plan.is_decode:
            decode(m, kv, indexer=i, indexer_kv_score=indexer_kv, records=plan.plan_d, cache_slots=out_loc)
        else:
            input_holds(kv, plan.plan_c, plan.plan_w, "main['kv_score_input']")
            c4_extend(m, kv, (plan.plan_c, plan.plan_w), indexer=i, indexer_kv_score=indexer_kv, cache_slots=out_loc)
    except ArgumentError as exc:
        if exc.argument == "indexer" and m.ring.dtype != i.ring.dtype:
            raise ArgumentValueError("indexer['kv_score_buffer']", f"indexer['kv_score_buffer'] is {i.ring.dtype} but "
                                     f"main['kv_score_buffer'] is {m.ring.dtype}: both rings hold one dtype") from None
        exc = input_rows_named(exc, kv, plan, (indexer_kv, out_loc))
        exc = input_rows_named(exc, indexer_kv, plan, (kv, out_loc), "indexer_kv_score")
        raise caller_words(exc, _LAYER_NAMES) from None
