"""pydsa: kernels for serving DeepSeek sparse-attention models.

- online c128 KV compression (DeepSeek-V4): c128_decode, c128_prefill, DevicePlan;
  plans come from the Cython planner pyplan.plan_prefill;
- speculative decoding (MTP): c128_verify over V drafts per request, c128_commit of the accepted ones;
- the KV-cache store (RMSNorm, fp8 with power-of-two scales, rotated rope tail, paged): KVCache, kv_store,
  and store= on the ops that close chunks;
- the ratio-4 compressor (DeepSeek-V4's c4 layers: main and indexer, stores fused): C4Compressor,
  c4_decode, c4_extend, c4_verify; pyplan.plan_c4 plans a request-scoped ring's extends;
- the offline c128 compressor (sglang's default c128 layer: a ring of raw rows, the store fused): C128Ring,
  c128_offline_decode, c128_offline_extend; pyplan.plan_c128_offline plans a request-scoped ring's extends;
- fused DSA metadata copy for CUDA-graph replay: MetadataCopy, metadata_copy.

Everything runs on CUDA tensors (kernels) and on CPU tensors (the host backend). A wrong argument raises a
pydsa.ArgumentError (a TypeError or ValueError) naming it, before anything runs; a status from the library a
pydsa.DsaError.
"""
from . import info as _info

_info.refuse_namesakes()  # before anything imports pyplan: a namesake's own failing import would hide the cause
from ._abi import ABI_VERSION, DEFAULT_PDL_FLAG, DsaError, check as check_status, lib as _lib
from ._tensors import error_count, reset_error_count
from .errors import ArgumentError, ArgumentTypeError, ArgumentValueError
from .c4 import (C4Compressor, C4Decode, c4_decode, c4_extend, c4_max_drafts, c4_plan_decode, c4_plan_extend,
                 c4_ring_bytes, c4_verify)
from .c128_offline import C128Ring, c128_offline_decode, c128_offline_extend
from .c128 import (C128Decode, C128Prefill, DevicePlan, c128_decode, c128_decode_records, c128_prefill,
                   c128_prefill_records)
from .metadata import MetadataCopy, metadata_copy
from .speculative import C128Commit, C128Verify, bank_bytes, c128_commit, c128_verify
from .store import KVCache, buffer_key, indexer_page_bytes, kv_page_bytes, kv_store

__version__ = _lib.dsa_version_string().decode()

__all__ = ["ABI_VERSION", "ArgumentError", "ArgumentTypeError", "ArgumentValueError", "DEFAULT_PDL_FLAG", "DsaError",
           "C4Compressor", "C4Decode", "c4_decode", "c4_extend", "c4_max_drafts", "c4_plan_decode", "c4_plan_extend",
           "c4_ring_bytes", "c4_verify", "buffer_key", "indexer_page_bytes", "C128Commit", "C128Decode", "C128Prefill", "C128Ring", "C128Verify",
           "DevicePlan", "c128_offline_decode", "c128_offline_extend",
           "KVCache", "MetadataCopy", "bank_bytes", "c128_commit", "c128_decode", "c128_decode_records", "c128_prefill",
           "c128_prefill_records", "c128_verify", "check_status", "error_count", "kv_page_bytes", "kv_store",
           "library_path", "metadata_copy",
           "reset_error_count", "__version__"]


def library_path() -> str:
    """Where libdsa_kernels was loaded from."""
    return _lib.path
