# Included by the shared reader (pydsa/_read.pyx): what both raw-ring families (c4, offline c128) read the same
# way: a ring's buffers when its description is made, an input apart from the rings a call writes, and a pyplan
# plan's geometry when an extend is called.
# Declared in pydsa/_read.pxd.


cdef int raw_ring(object ring, object ape, int parts, int64_t ape_rows, int64_t row_unit, str what_rows, RawRing* out,
                  list views) except -1:
    cdef Arg r, a
    shape = getattr(ring, "shape", None)
    if shape is None or len(shape) != 2 or shape[1] % parts or shape[1] // parts not in (128, 256, 512):
        raise ArgumentValueError("ring", f"ring must be a 2-D tensor [rows, {parts}D] with D 128, 256 or 512 (got "
                                         f"shape {None if shape is None else tuple(shape)})")
    if shape[0] < row_unit or shape[0] % row_unit:
        raise ArgumentValueError("ring", f"ring has {shape[0]} rows; expected a positive multiple of {row_unit} "
                                         f"({what_rows})")
    cdef int64_t d = shape[1] // parts
    read(ring, &r, "ring", views)
    if r.dev == OTHER_DEVICE or (r.dtype != F32 and r.dtype != BF16):
        tensor(ring, &r, "ring", F32, -1 if r.dev == OTHER_DEVICE else r.dev, 2, ANY, parts * d, views)  # raises
    tensor(ring, &r, "ring", r.dtype, r.dev, 2, ANY, parts * d, views)  # contiguous
    tensor(ape, &a, "ape", F32, r.dev, 2, ape_rows, d, views)
    out.dev, out.dtype, out.data, out.rows, out.head_dim = r.dev, r.dtype, r.data, r.shape[0], d
    out.ape = <const float*>a.data
    return 0


cdef int apart_from_ring(const void* input, int64_t input_bytes, str input_name, const void* ring, int64_t ring_bytes,
                         str owner) except -1:
    if overlap(input, input_bytes, ring, ring_bytes):
        raise ArgumentValueError(input_name, f"{input_name} shares memory with {owner}.ring, which the op writes as it reads "
                                             f"the input: pass an input of its own")
    return 0


cdef int plan_geometry(object plan, int ratio, str ring_name, object ring_size, object num_slots,
                       object kv_score) except -1:
    plan_ring = getattr(plan, "ring_size", None)
    if plan_ring is None:
        return 0
    made_by = {4: "pyplan.plan_c4 (a c4 ring's records)", 128: "pyplan.plan_c128_offline (an offline c128 ring's records)"}
    plan_ratio = getattr(plan, "ratio", 4)
    if plan_ratio != ratio:
        raise ArgumentValueError("plan", f"plan was made by {made_by.get(plan_ratio, plan_ratio)}; this extend takes "
                                         f"{made_by[ratio].split(' ')[0]}'s")
    if ring_size is None:
        raise ArgumentValueError(ring_name, f"plan was made by {made_by[ratio].split(' ')[0]} for a request-scoped ring "
                                            f"(ring_size {plan_ring}) but {ring_name} was made without ring_size")
    if plan_ring != ring_size:
        raise ArgumentValueError("plan", f"plan was made for ring_size {plan_ring} but {ring_name}.ring_size is "
                                         f"{ring_size}")
    plan_slots = getattr(plan, "num_slots", None)
    if plan_slots is not None and plan_slots > num_slots:
        raise ArgumentValueError("plan", f"plan was made for {plan_slots} slots but {ring_name}'s ring holds {num_slots}")
    plan_tokens = getattr(plan, "num_tokens", None)
    shape = getattr(kv_score, "shape", None)
    if plan_tokens is not None and shape is not None and len(shape) == 2 and shape[0] != plan_tokens:
        raise ArgumentValueError("kv_score", f"kv_score has {shape[0]} rows but plan was made for num_tokens = "
                                             f"{plan_tokens} (its input rows)")
    return 0
