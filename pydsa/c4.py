"""The ratio-4 compressor of DeepSeek-V4 (docs/spec.md, "The ratio-4 compressor").

Every c4 layer runs two compressors over the same positions: the main one (D = 512, stored into a
KVCache of layout "v4", page size 64) and the indexer's (D = 128, stored into a KVCache of layout
"indexer"). Each keeps a ring of raw input rows ([rows, 4D], fp32 or bf16); a token's input row is fp32
[kv_A | kv_B | score_A | score_B]; entry n closes at position 4n + 3 from the A halves of the previous
quartet and the B halves of its own.

- ``c4_decode``: one token per request, both compressors and both stores in one launch; the ring rows
  come from sglang's 16-byte decode records (``records=``) or pydsa's request-scoped ring
  (``seq_lens=``, ``slots=``, ``ring_size=``: request slot s owns rows s*R .. s*R+R-1).
- ``c4_extend``: new tokens at ragged rows, by compress and write records (sglang's formats, or
  ``pyplan.plan_c4`` for a request-scoped ring); two launches (every ring read before any ring write).
- ``c4_verify``: V drafts per request over the request-scoped ring, with V bounded by the ring
  (``c4_max_drafts``); no commit: the next call simply starts at the first rejected position.
"""
from __future__ import annotations

import ctypes as C

from . import _fill_c4
from ._abi import check as _check_status, lib, pdl_flag
from ._op import Prepared
from .errors import ArgumentTypeError, ArgumentValueError

__all__ = ["C4Compressor", "C4Decode", "c4_decode", "c4_extend", "c4_verify", "c4_max_drafts", "c4_ring_bytes"]

_c4 = _fill_c4.c4
_DECODE, _EXTEND, _VERIFY = 0, 1, 2


def c4_max_drafts(ring_size: int, *, reject_all: bool = False) -> int:
    """The most drafts c4_verify takes with a ring of `ring_size` rows per request: R - 6 when the first
    draft is always accepted (a target verify: it is the token already sampled), R - 7 with
    reject_all=True (a step may accept none). A larger V would overwrite ring rows the next step reads."""
    if isinstance(ring_size, bool) or not isinstance(ring_size, int) or ring_size < 8 or ring_size % 4:
        raise ArgumentValueError("ring_size", f"ring_size must be a multiple of 4, >= 8 (got {ring_size!r})")
    return lib.dsa_c4_max_drafts(ring_size, 1 if reject_all else 0)


def c4_ring_bytes(head_dim: int, ring_size: int, *, bf16: bool = False) -> int:
    """Bytes of one request's ring: ring_size rows of 4 * head_dim values."""
    return ring_size * 4 * head_dim * (2 if bf16 else 4)


C4Compressor = _fill_c4.C4Compressor


def c4_decode(main: C4Compressor, kv_score, *, indexer: C4Compressor | None = None, indexer_kv_score=None,
              records=None, seq_lens=None, slots=None, ring_size: int | None = None, out=None, indexer_out=None,
              cache_slots=None, stream=None, pdl=None, error_count=None) -> None:
    """One decode step of a c4 layer: kv_score [B, 4D] (and indexer_kv_score [B, 4 * 128]) hold each
    request's new token. Its row goes to the ring; a request whose length (with the token) is a multiple
    of 4 closes an entry: written to out [B, D] (optional) and stored at cache_slots[b] (int64 [B]) into
    each compressor's store, rotary row seq_len - 4. One launch for both compressors.

    Rows: records= (uint8 [B, 16], sglang's decode records: seq_len, write row, previous and current
    group; seq_len 0 is padding), or seq_lens= (int32 [B], with the new token; <= 0 padding), slots=
    (int32 [B]; negative: not held here) and ring_size= for pydsa's request-scoped ring."""
    status = _c4(_DECODE, stream=stream, main=main, kv_score=kv_score, out=out, indexer=indexer, indexer_kv_score=indexer_kv_score,
         indexer_out=indexer_out, records=records, seq_lens=seq_lens, slots=slots, ring_size=ring_size,
         cache_slots=cache_slots, flags=pdl_flag(pdl), error_count=error_count)
    if status:
        _check_status(status)  # raises


def c4_extend(main: C4Compressor, kv_score, plan, *, indexer: C4Compressor | None = None, indexer_kv_score=None,
              out=None, indexer_out=None, cache_slots=None, stream=None, pdl=None, error_count=None) -> None:
    """New tokens of a c4 layer at ragged rows of kv_score [N, 4D] (N <= 65536): plan = (compress uint8
    [C, 16], write uint8 [W, 8]) on the op's device (sglang's records, or pyplan.plan_c4's). Compress
    record i closes an entry: out [C, D] row i (optional) and stored at cache_slots[its ragged row]
    (int64 [N]); then each write record copies its input row into the ring."""
    compress, write = _plan_pair(plan)
    status = _c4(_EXTEND, stream=stream, main=main, kv_score=kv_score, out=out, indexer=indexer, indexer_kv_score=indexer_kv_score,
         indexer_out=indexer_out, records=compress, write=write, cache_slots=cache_slots, flags=pdl_flag(pdl),
         error_count=error_count)
    if status:
        _check_status(status)  # raises


def c4_verify(main: C4Compressor, drafts, seq_lens, slots, *, num_drafts: int, ring_size: int,
              indexer: C4Compressor | None = None, indexer_drafts=None, out=None, indexer_out=None,
              cache_slots=None, reject_all: bool = False, stream=None, pdl=None, error_count=None) -> None:
    """V = num_drafts drafts per request over pydsa's request-scoped ring: drafts [B * V, 4D], draft j of
    request b at row b * V + j, at position seq_lens[b] + j (seq_lens int32 [B]: committed length; < 0
    padding). Entries the drafts close go to out [B * V, D] at the closing draft's row and are stored at
    cache_slots[that row]; every draft's row is written to the ring. No commit: the next decode or extend
    starts at the first rejected position and overwrites the rejected rows. V is at most
    c4_max_drafts(ring_size, reject_all=...); a larger V is refused, naming the bound."""
    if not isinstance(reject_all, bool):
        raise ArgumentTypeError("reject_all", f"reject_all must be a bool (got {reject_all!r})")
    flags = pdl_flag(pdl) | (_fill_c4.REJECT_ALL if reject_all else 0)
    status = _c4(_VERIFY, stream=stream, main=main, kv_score=drafts, out=out, indexer=indexer, indexer_kv_score=indexer_drafts,
         indexer_out=indexer_out, seq_lens=seq_lens, slots=slots, ring_size=ring_size, num_drafts=num_drafts,
         cache_slots=cache_slots, flags=flags, error_count=error_count)
    if status:
        _check_status(status)  # raises


def _plan_pair(plan):
    try:
        compress, write = plan
    except (TypeError, ValueError):
        raise ArgumentTypeError("plan", f"plan must be a pair (compress uint8 [C, 16], write uint8 [W, 8]) (got "
                                        f"{type(plan).__name__})") from None
    return compress, write


class C4Decode(Prepared):
    """A c4 decode with its arguments checked once (CUDA-graph replay, or a step loop over fixed
    buffers): launch() runs it again on the same tensors, whatever they hold then."""

    _op, _fill = "c4_decode", staticmethod(_fill_c4.c4)

    def __init__(self, main: C4Compressor, kv_score, *, indexer: C4Compressor | None = None, indexer_kv_score=None,
                 records=None, seq_lens=None, slots=None, ring_size: int | None = None, out=None, indexer_out=None,
                 cache_slots=None, pdl=None, error_count=None):
        self._bind(_DECODE, main=main, kv_score=kv_score, out=out, indexer=indexer,
                   indexer_kv_score=indexer_kv_score, indexer_out=indexer_out, records=records, seq_lens=seq_lens,
                   slots=slots, ring_size=ring_size, cache_slots=cache_slots, flags=pdl_flag(pdl),
                   error_count=error_count)


del C
