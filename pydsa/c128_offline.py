"""The offline c128 compressor (docs/spec.md, "The offline c128 compressor"): what sglang 0.5.23 runs for a c128
layer unless its online flag is set.

The state is a ring of raw input rows ([rows, 2D], fp32 or bf16, pages of 128 rows) with the layer's ape and
store, described once by ``C128Ring``. A token's input row is fp32 [kv | score]; chunk n of a request closes at
position 128n + 127 and is, per channel, the softmax over its 128 rows of score + ape[j] weighting kv, stored
(RMSNorm, fp8, rope, page) at rotary row 128n.

- ``c128_offline_decode``: one token per request, its row written and a closing row's chunk computed and stored
  in one launch; rows from sglang's 16-byte decode records (``records=``) or the ring's request-scoped slots
  (``seq_lens=``, ``slots=``: slot s owns rows s*R .. s*R+R-1).
- ``c128_offline_extend``: new tokens at ragged rows by compress and write records (sglang's formats, or
  ``pyplan.plan_c128_offline`` for the request-scoped ring); two launches, every ring read before any write.
"""
from __future__ import annotations

from . import _fill_c128_offline

__all__ = ["C128Ring", "c128_offline_decode", "c128_offline_extend"]

C128Ring = _fill_c128_offline.C128Ring

c128_offline_decode = _fill_c128_offline.c128_offline_decode  # compiled: each call goes straight to its fill
c128_offline_extend = _fill_c128_offline.c128_offline_extend
