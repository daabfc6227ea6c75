"""Host prefill planner for online c128 compression (docs/spec.md, the plan), written in Cython.

``compress, write = plan_prefill(seq_lens, extend_lens)`` cuts every request's new tokens into
segments that stay inside one 128-token chunk and returns two arrays of ``SEGMENT_DTYPE``.
``compress, write = plan_c4(seq_lens, extend_lens, slots, ring_size)`` plans a c4 extend over a
request-scoped ring (uint8 records in sglang's formats).
"""
from ._plan import (C4_COMPRESS_DTYPE, C4_WRITE_DTYPE, CHUNK, SEGMENT_DTYPE, SENTINEL, compress_capacity, plan_c4,
                    plan_prefill, record_lists)

__all__ = ["C4_COMPRESS_DTYPE", "C4_WRITE_DTYPE", "SEGMENT_DTYPE", "SENTINEL", "CHUNK", "compress_capacity", "plan_c4",
           "plan_prefill", "record_lists"]
