"""Host prefill planner for online c128 compression (docs/spec.md, the plan), written in Cython.

``compress, write = plan_prefill(seq_lens, extend_lens)`` cuts every request's new tokens into
segments that stay inside one 128-token chunk and returns two arrays of ``SEGMENT_DTYPE``.
``compress, write = plan_c4(seq_lens, extend_lens, slots, ring_size)`` plans a c4 extend over a
request-scoped ring (uint8 records in sglang's formats, in a C4Plan carrying the ring it was made for);
``plan_c128_offline(seq_lens, extend_lens, slots, ring_size=128)`` the same for an offline c128 ring.

This is the planner of the distribution dsa-kernels (with pydsa); the package index's `pyplan` is an unrelated
project of the same name.
"""
from ._plan import (C128OfflinePlan, C4Plan, C4_COMPRESS_DTYPE, C4_WRITE_DTYPE, CHUNK, SEGMENT_DTYPE, SENTINEL,
                    compress_capacity, plan_c4, plan_c128_offline, plan_prefill, record_lists)

__all__ = ["C128OfflinePlan", "C4Plan", "C4_COMPRESS_DTYPE", "C4_WRITE_DTYPE", "SEGMENT_DTYPE", "SENTINEL", "CHUNK",
           "compress_capacity", "plan_c4", "plan_c128_offline", "plan_prefill", "record_lists"]
