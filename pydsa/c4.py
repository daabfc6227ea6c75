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

from . import _fill_c4, _fill_c4_plan
from ._abi import lib
from .errors import ArgumentValueError, bool_argument, int_argument

__all__ = ["C4Compressor", "C4Decode", "c4_decode", "c4_extend", "c4_verify", "c4_max_drafts", "c4_ring_bytes",
           "c4_plan_decode", "c4_plan_extend"]



def _ring_size(ring_size) -> int:
    r = int_argument(ring_size, "ring_size", 8, 2 ** 20, " (rows per request slot, a multiple of 4)")
    if r % 4:
        raise ArgumentValueError("ring_size", f"ring_size is {r}; expected a multiple of 4, >= 8")
    return r


def c4_max_drafts(ring_size: int, *, reject_all: bool = False) -> int:
    """The most drafts c4_verify takes with a ring of `ring_size` rows per request: R - 6 when the first
    draft is always accepted (a target verify: it is the token already sampled), R - 7 with
    reject_all=True (a step may accept none). A larger V would overwrite ring rows the next step reads."""
    r = _ring_size(ring_size)
    bool_argument(reject_all, "reject_all")
    return lib.dsa_c4_max_drafts(r, 1 if reject_all else 0)


def c4_ring_bytes(head_dim: int, ring_size: int, *, bf16: bool = False) -> int:
    """Bytes of one request's ring: ring_size rows of 4 * head_dim values (fp32, or bf16 with bf16=True)."""
    if head_dim not in (128, 256, 512) or isinstance(head_dim, bool) or not isinstance(head_dim, int):
        raise ArgumentValueError("head_dim", f"head_dim must be 128, 256 or 512 (got {head_dim!r})")
    bool_argument(bf16, "bf16")
    return _ring_size(ring_size) * 4 * head_dim * (2 if bf16 else 4)


C4Compressor = _fill_c4.C4Compressor


c4_decode = _fill_c4.c4_decode  # compiled: each call goes straight to its fill (pydsa/_fill_c4.pyx)
c4_extend = _fill_c4.c4_extend
c4_verify = _fill_c4.c4_verify
# the prepared decode (compiled, over pydsa/_read.pyx's Prepared): arguments judged once, launch() runs it again
C4Decode = _fill_c4.C4Decode

# the c4 planners over sglang's page-scoped rings (compiled, pydsa/_fill_c4_plan.pyx): a step's decode or extend
# records from the engine's tables, written on the tables' device in one launch; each returns the library's status
# (pydsa.check_status raises it), the launch flags are the caller's (pydsa.DEFAULT_PDL_FLAG: the ops' default)
c4_plan_decode = _fill_c4_plan.decode_plan
c4_plan_extend = _fill_c4_plan.extend_plan

