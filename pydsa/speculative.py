"""Speculative decoding for online c128 (docs/spec.md, speculative decoding): verify V drafts per request in one launch per
layer, keep the state after every draft prefix in a bank, and commit the accepted prefix without
copying state.

The bank is made of slots of each layer's state buffer: V + 1 entries per request, entry j of
request b at slot ``bank_indices[b] + j * bank_stride``, holding the state after the first j
drafts (entry 0: before them). A step of an engine, every index tensor int32 on the device:

    for each c128 layer:  c128_verify(state, drafts, out, ape, load, seq, bank)   # main slots untouched
    (the target model samples; accepted [B] stays on the device)
    once per step:        c128_commit(seq, accepted, load, bank, load_indices=load, num_drafts=V)

`load` then names, for every request, the slot holding the state after its accepted tokens: the
next verify takes it as `indices`, a decode or prefill as `load_indices`. Slots are numbered alike
in every layer's buffer, so one commit serves every layer. `states=[...]` instead copies the
accepted entries onto `indices` in every listed layer in one launch (main slots stay current).
"""
from __future__ import annotations

import ctypes as C

from . import _calls
from ._abi import (COMMIT_FORMAT, DEFAULT_PDL_FLAG, FLAG_PDL, MAX_DRAFTS, VERIFY_FORMAT, check as _check_status, lib,
                   pdl_flag)
from ._tensors import _float32, _int32, as_tensor, error_ptr, ptr, rows_ptr
from .c128 import CHUNK, DECLINED, _launch_once, _Prepared, _state
from .store import store_fields

__all__ = ["c128_verify", "c128_commit", "C128Verify", "C128Commit", "bank_bytes"]

_verify_fn = lib.dsa_c128_verify
_commit_fn = lib.dsa_c128_commit
_VERIFY_SIZE = VERIFY_FORMAT.size
_COMMIT_SIZE = COMMIT_FORMAT.size


def bank_bytes(batch_size: int, num_drafts: int, head_dim: int = 512, state_dtype_bytes: int = 4) -> int:
    """Bytes of the bank per layer: (V + 1) state slots per request."""
    return batch_size * (num_drafts + 1) * 3 * head_dim * state_dtype_bytes


def _stride(bank_stride) -> int:
    if type(bank_stride) is not int or not 1 <= bank_stride < 2**31:
        raise ValueError(f"bank_stride must be an int in 1..2**31-1 (got {bank_stride!r})")
    return bank_stride


def _verify_fields(state, kv_score, out, ape, indices, seq_lens, bank_indices, bank_stride, verify_lens, pdl,
                   error_count, store=None, cache_slots=None) -> tuple:
    sp, dev, slots, d, sdt = _state(state)
    try:
        b = seq_lens.shape[0]
    except (AttributeError, IndexError):
        b = None
    sl = ptr(seq_lens, "seq_lens", _int32, dev, (b,))
    kp, rows = rows_ptr(kv_score, "kv_score", _float32, dev, 2 * d)
    if b == 0 or rows % b != 0 or not 1 <= rows // b <= MAX_DRAFTS:
        raise ValueError(f"kv_score must have B * V rows with B = seq_lens.shape[0] = {b} and V in 1..{MAX_DRAFTS} "
                         f"(got {rows} rows)")
    v = rows // b
    return (_VERIFY_SIZE, pdl_flag(pdl), dev, d, slots, b, v, sdt, sp, kp,
            0 if out is None else ptr(out, "out", _float32, dev, (rows, d)), ptr(ape, "ape", _float32, dev, (CHUNK, d)),
            sl, 0 if verify_lens is None else ptr(verify_lens, "verify_lens", _int32, dev, (b,)),
            ptr(indices, "indices", _int32, dev, (b,)), ptr(bank_indices, "bank_indices", _int32, dev, (b,)),
            _stride(bank_stride), error_ptr(error_count, dev), *store_fields(store, cache_slots, dev, d, rows))


def c128_verify(state, kv_score, out, ape, indices, seq_lens, bank_indices, *, bank_stride=1, verify_lens=None,
                store=None, cache_slots=None, stream=None, pdl=None, error_count=None) -> None:
    """Runs each request's drafts through the decode arithmetic (docs/spec.md, speculative decoding) and stores the state after
    every draft prefix in the bank; main slots are never written.

    state [S,1,3D] f32 or bf16 (the bank is slots of it); kv_score [B*V,2D] f32, draft j of request b
    at row b*V+j (V = rows / B, 1..16); out [B*V,D] f32 or None: a chunk closed by draft j goes to row
    b*V+j, other rows untouched; ape [128,D]; indices [B] int32: slot holding the state after seq
    tokens (read when seq is not a multiple of 128); seq_lens [B] int32: committed length before the
    drafts (< 0: padding; 0: a request with no committed tokens); bank_indices [B] int32: slot of bank
    entry 0, entry j at + j*bank_stride; verify_lens [B] int32: drafts of each request (0..V), default V.
    store: a pydsa.KVCache that the vector a draft closes is stored into, at cache_slots[b*V+j] (int64
    [B*V]); an engine ignores the entries of rejected drafts. Nothing with B == 0 rows."""
    flags = DEFAULT_PDL_FLAG if pdl is None else FLAG_PDL if pdl else 0  # pdl_flag, inline
    if type(bank_stride) is int and 1 <= bank_stride < 2**31:
        status = _calls.verify(state, kv_score, out, ape, indices, seq_lens, bank_indices, bank_stride, verify_lens,
                               stream, flags, error_count, store, cache_slots)
        if status != DECLINED:
            if status:
                _check_status(status)
            return
    if getattr(seq_lens, "shape", None) is not None and tuple(seq_lens.shape) == (0,):
        return
    _launch_once("verify", VERIFY_FORMAT, _verify_fn,
                 _verify_fields(state, kv_score, out, ape, indices, seq_lens, bank_indices, bank_stride, verify_lens,
                                pdl, error_count, store, cache_slots), stream)


class C128Verify(_Prepared):
    """A validated verify over fixed buffers; launch() re-runs it (CUDA-graph capture or replay)."""

    _fn = _verify_fn
    _format = VERIFY_FORMAT
    _op = _calls.OP_VERIFY

    def __init__(self, state, kv_score, out, ape, indices, seq_lens, bank_indices, *, bank_stride=1,
                 verify_lens=None, store=None, cache_slots=None, pdl=None, error_count=None):
        self._bind_fields(_verify_fields(state, kv_score, out, ape, indices, seq_lens, bank_indices, bank_stride,
                                         verify_lens, pdl, error_count, store, cache_slots))
        self._keep = (state, kv_score, out, ape, indices, seq_lens, bank_indices, verify_lens, error_count, store,
                      cache_slots)


def _commit_fields(seq_lens, accepted, indices, bank_indices, bank_stride, num_drafts, verify_lens, load_indices,
                   states, num_slots, pdl, error_count) -> tuple:
    if type(num_drafts) is not int or not 1 <= num_drafts <= MAX_DRAFTS:
        raise ValueError(f"num_drafts must be an int in 1..{MAX_DRAFTS} (got {num_drafts!r})")
    seq_lens = as_tensor(seq_lens, "seq_lens")
    if seq_lens.dim() != 1:
        raise ValueError(f"seq_lens must have shape [B] (got {list(seq_lens.shape)})")
    dev, b = seq_lens.get_device(), seq_lens.shape[0]
    sl = ptr(seq_lens, "seq_lens", _int32, dev, (b,))
    fields = dict(accepted=ptr(accepted, "accepted", _int32, dev, (b,)),
                  indices=ptr(indices, "indices", _int32, dev, (b,)),
                  bank=ptr(bank_indices, "bank_indices", _int32, dev, (b,)),
                  verify=0 if verify_lens is None else ptr(verify_lens, "verify_lens", _int32, dev, (b,)))
    if (load_indices is None) == (states is None):
        raise ValueError("give exactly one of load_indices (the slots to resolve) and states (the layers to copy)")
    d = sdt = 0
    layers, array = 0, None
    if states is not None:
        states = [as_tensor(st, f"states[{i}]") for i, st in enumerate(states)]
        if not states:
            raise ValueError("states must hold at least one state buffer")
        shapes = set()
        for i, st in enumerate(states):
            _, sdev, slots, d, sdt = _state(st)
            if sdev != dev:
                raise ValueError(f"states[{i}] is on {st.device} but seq_lens is on {seq_lens.device}")
            shapes.add((tuple(st.shape), st.dtype))
        if len(shapes) != 1:
            raise ValueError(f"every state buffer in states must have one shape and dtype (got {sorted(map(str, shapes))})")
        num_slots = slots
        layers = len(states)
        array = (C.c_void_p * layers)(*(st.data_ptr() for st in states))
        load = 0
    else:
        load = ptr(load_indices, "load_indices", _int32, dev, (b,))
        if type(num_slots) is not int or not 1 <= num_slots < 2**31:
            raise ValueError(f"num_slots must be an int in 1..2**31-1 with load_indices (got {num_slots!r})")
    packed = (_COMMIT_SIZE, FLAG_PDL if pdl else 0, dev, d, num_slots, b, num_drafts, sdt, sl, fields["accepted"],
              fields["verify"], fields["indices"], fields["bank"], _stride(bank_stride), load, layers, 0,
              0 if array is None else C.addressof(array), error_ptr(error_count, dev))
    return packed, array


def c128_commit(seq_lens, accepted, indices, bank_indices, *, num_drafts, bank_stride=1, verify_lens=None,
                load_indices=None, num_slots=2**31 - 1, states=None, stream=None, pdl=False, error_count=None) -> None:
    """Commits the accepted drafts of a verify step (docs/spec.md, speculative decoding), with no host synchronization.

    seq_lens, indices, bank_indices, bank_stride, verify_lens: as given to c128_verify; accepted [B]
    int32: drafts accepted (clamped to 0..v_b). Either load_indices [B] int32 (may be `indices`
    itself): written with the slot holding each request's state after seq + a_b tokens, for every
    layer at once (num_slots: rows of the state buffers, for the range check); or states, a list of
    state buffers alike: the accepted bank entry is copied onto indices[b] in every one, in one
    launch per 64 layers."""
    flags = FLAG_PDL if pdl else 0
    if (states is None and load_indices is not None and type(num_drafts) is int and 1 <= num_drafts <= MAX_DRAFTS
            and type(bank_stride) is int and 1 <= bank_stride < 2**31 and type(num_slots) is int
            and 1 <= num_slots < 2**31):
        status = _calls.commit_slots(seq_lens, accepted, indices, bank_indices, load_indices, num_slots, num_drafts,
                                     bank_stride, verify_lens, stream, flags, error_count)
        if status != DECLINED:
            if status:
                _check_status(status)
            return
    fields, array = _commit_fields(seq_lens, accepted, indices, bank_indices, bank_stride, num_drafts, verify_lens,
                                   load_indices, states, num_slots, pdl, error_count)
    _launch_once("commit", COMMIT_FORMAT, _commit_fn, fields, stream)
    del array  # the library read the layer pointers during the call


class C128Commit(_Prepared):
    """A validated commit over fixed buffers (c128_commit's arguments); launch() re-runs it, e.g.
    inside the CUDA graph of a speculative step."""

    _fn = _commit_fn
    _format = COMMIT_FORMAT
    _op = _calls.OP_COMMIT

    def __init__(self, seq_lens, accepted, indices, bank_indices, *, num_drafts, bank_stride=1, verify_lens=None,
                 load_indices=None, num_slots=2**31 - 1, states=None, pdl=False, error_count=None):
        fields, self._array = _commit_fields(seq_lens, accepted, indices, bank_indices, bank_stride, num_drafts,
                                             verify_lens, load_indices, states, num_slots, pdl, error_count)
        self._bind_fields(fields)
        self._keep = (seq_lens, accepted, indices, bank_indices, verify_lens, load_indices, states, error_count)

