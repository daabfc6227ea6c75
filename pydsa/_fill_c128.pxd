# The online c128 family's params head: the fields every one of its ops' params (dsa_c128_decode_params,
# dsa_c128_prefill_params, dsa_c128_verify_params, dsa_c128_commit_params) begins with, in the header's order
# (tests/test_house.py holds the four to it). Its fillers (pydsa/_fill_c128.pyx, pydsa/_fill_speculative.pyx)
# cimport it.
from libc.stdint cimport int32_t, int64_t, uint32_t

cdef struct c128_head:
    uint32_t struct_size
    uint32_t flags
    int32_t device
    int32_t head_dim
    int64_t num_slots
    int64_t batch_size


cdef inline void fill_head(void* params, uint32_t struct_size, uint32_t flags, int32_t device, int64_t head_dim,
                           int64_t num_slots, int64_t batch_size) noexcept:
    """Writes the head of a c128 op's params (struct_size: the op's params size)."""
    cdef c128_head* h = <c128_head*>params
    h.struct_size = struct_size
    h.flags = flags
    h.device = device
    h.head_dim = <int32_t>head_dim
    h.num_slots = num_slots
    h.batch_size = batch_size
