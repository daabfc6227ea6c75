"""Host prefill planner for online c128 compression (docs/spec.md, the plan), written in Cython.

``compress, write = plan_prefill(seq_lens, extend_lens)`` cuts every request's new tokens into
segments that stay inside one 128-token chunk and returns two arrays of ``SEGMENT_DTYPE``.
"""
from ._plan import SEGMENT_DTYPE, SENTINEL, CHUNK, compress_capacity, plan_prefill, record_lists

__all__ = ["SEGMENT_DTYPE", "SENTINEL", "CHUNK", "compress_capacity", "plan_prefill", "record_lists"]
