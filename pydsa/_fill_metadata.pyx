# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The metadata copy's params: a bound set of destinations (MetadataCopy), then each step's sizes and
source pointers, filled from the sources (each judged here or by the shared reader, pydsa/_read.pyx,
which raise the error naming a wrong one). Two conventions: sizes from the sources' shapes
(MetadataCopy), or sizes given with every source taken flat (fill_flat_sources)."""
from libc.stdint cimport int32_t, int64_t, uint32_t, uintptr_t
from libc.string cimport memset

from pydsa._read cimport *

from pydsa.errors import ArgumentValueError

cdef extern from "dsa_kernels.h":  # this family's params, as the header lays them out
    int DSA_STRUCT_METADATA_PARAMS
    ctypedef struct dsa_metadata_sources:
        const int32_t* cache_seqlens
        const int32_t* cu_seqlens_k
        const int32_t* page_indices
        const int32_t* seqlens_expanded
        const int32_t* dsa_cache_seqlens
        const int32_t* dsa_cu_seqlens_k
        const int32_t* real_page_table
        const int32_t* num_splits
        const int32_t* flashmla_metadata
    int DSA_STRUCT_METADATA_DESTINATION
    enum: DSA_MAX_DESTINATIONS  # a constant: the length of Destinations' array
    ctypedef struct dsa_metadata_destination:
        int32_t* cache_seqlens
        int64_t cache_seqlens_len
        int32_t* cu_seqlens_k
        int64_t cu_seqlens_k_len
        int32_t* page_table
        int64_t page_table_rows
        int64_t page_table_cols
        int64_t page_table_stride
        int32_t* seqlens_expanded
        int64_t seqlens_expanded_len
        int32_t* dsa_cache_seqlens
        int64_t dsa_cache_seqlens_len
        int32_t* dsa_cu_seqlens_k
        int64_t dsa_cu_seqlens_k_len
        int32_t* real_page_table
        int64_t real_page_table_rows
        int64_t real_page_table_cols
        int64_t real_page_table_stride
        int32_t* num_splits
        int64_t num_splits_len
        int32_t* flashmla_metadata
        int64_t flashmla_metadata_len
    ctypedef struct dsa_metadata_copy_params:
        uint32_t struct_size
        uint32_t flags
        int32_t device
        int32_t mode
        int64_t bs
        int64_t page_rows
        int64_t page_width
        int64_t expanded
        int64_t real_cols
        int64_t metadata_size
        dsa_metadata_sources src
        int32_t num_destinations
        int32_t reserved
        const dsa_metadata_destination* destinations

cdef int OP_METADATA = declare_op("metadata", "dsa_metadata_copy", DSA_STRUCT_METADATA_PARAMS,
                                  sizeof(dsa_metadata_copy_params))



cdef void _sources(dsa_metadata_copy_params* p, int64_t bs, int64_t rows, int64_t width, int64_t expanded,
                   int64_t real_cols, int64_t meta, const Arg* cs, const Arg* cu, const Arg* pi, const Arg* se,
                   const Arg* dc, const Arg* du, const Arg* rp, const Arg* ns, const Arg* fm) noexcept:
    """Writes one step's sizes and source pointers (checked by the caller) into the params."""
    p.bs = bs
    p.page_rows = rows
    p.page_width = width
    p.expanded = expanded
    p.real_cols = real_cols
    p.metadata_size = meta
    p.src.cache_seqlens = <const int32_t*>cs.data
    p.src.cu_seqlens_k = <const int32_t*>cu.data
    p.src.page_indices = <const int32_t*>pi.data
    p.src.seqlens_expanded = <const int32_t*>se.data
    p.src.dsa_cache_seqlens = <const int32_t*>dc.data
    p.src.dsa_cu_seqlens_k = <const int32_t*>du.data
    p.src.real_page_table = <const int32_t*>rp.data
    p.src.num_splits = <const int32_t*>ns.data
    p.src.flashmla_metadata = <const int32_t*>fm.data


declare_struct("metadata_destination", DSA_STRUCT_METADATA_DESTINATION, sizeof(dsa_metadata_destination))


cdef int _set(dsa_metadata_destination* d, int field, t) except -1:
    """Field `field` (MetadataCopy's order: cache_seqlens, cu_seqlens_k, page_table, seqlens_expanded,
    dsa_cache_seqlens, dsa_cu_seqlens_k, real_page_table, num_splits, flashmla_metadata) of `d` from its checked
    tensor: the data, and its length or its rows, columns and row stride."""
    cdef int32_t* data = <int32_t*><uintptr_t>t.data_ptr()
    cdef int64_t n = t.numel()
    if field == 0:
        d.cache_seqlens, d.cache_seqlens_len = data, n
    elif field == 1:
        d.cu_seqlens_k, d.cu_seqlens_k_len = data, n
    elif field == 2:
        d.page_table, d.page_table_rows, d.page_table_cols, d.page_table_stride = data, t.shape[0], t.shape[1], t.stride(0)
    elif field == 3:
        d.seqlens_expanded, d.seqlens_expanded_len = data, n
    elif field == 4:
        d.dsa_cache_seqlens, d.dsa_cache_seqlens_len = data, n
    elif field == 5:
        d.dsa_cu_seqlens_k, d.dsa_cu_seqlens_k_len = data, n
    elif field == 6:
        d.real_page_table, d.real_page_table_rows, d.real_page_table_cols, d.real_page_table_stride = \
            data, t.shape[0], t.shape[1], t.stride(0)
    elif field == 7:
        d.num_splits, d.num_splits_len = data, n
    else:
        d.flashmla_metadata, d.flashmla_metadata_len = data, n
    return 0


cdef class Destinations:
    """A metadata copy's destination sets as the library reads them (dsa_metadata_destination [K], host memory),
    made once from MetadataCopy's checked tensors: tensors[k][field] (None: absent); `address` is the array's."""
    cdef dsa_metadata_destination items[DSA_MAX_DESTINATIONS]
    cdef readonly int count
    cdef list keep

    def __init__(self, list tensors):
        if not 1 <= len(tensors) <= DSA_MAX_DESTINATIONS:
            raise ArgumentValueError("destinations", f"destinations must hold 1..{DSA_MAX_DESTINATIONS} sets "
                                                     f"(got {len(tensors)})")
        memset(self.items, 0, sizeof(self.items))
        for k, row in enumerate(tensors):
            for field, t in enumerate(row):
                if t is not None:
                    _set(&self.items[k], field, t)
        self.count = len(tensors)
        self.keep = tensors

    @property
    def address(self):
        return <uintptr_t>self.items


def init_metadata(uintptr_t address, *, uint32_t flags, int32_t dev, int32_t mode, int32_t num_destinations,
                  uintptr_t destinations):
    """The metadata params at `address` for a bound set of destinations: device, mode and the
    destination array; every size and source zero until a step's sources are filled."""
    cdef dsa_metadata_copy_params* p = <dsa_metadata_copy_params*>address
    memset(p, 0, sizeof(dsa_metadata_copy_params))
    p.struct_size = sizeof(dsa_metadata_copy_params)
    p.flags = flags
    p.device = dev
    p.mode = mode
    p.num_destinations = num_destinations
    p.destinations = <const dsa_metadata_destination*>destinations


cdef object _bad(str name, str why):
    return ArgumentValueError(name, f"{name}: {why}")


cdef int64_t _length(object obj, Arg* a, str name, int32_t dev, list keep) except -1:
    """A contiguous int32 1-D source on `dev`: its length."""
    tensor(obj, a, name, I32, dev, 1, ANY, ANY, keep)
    return a.shape[0]


def fill_metadata_sources(uintptr_t address, *, bint decode, bint has_real_page_table, bint has_flashmla,
                          cache_seqlens, cu_seqlens_k, page_indices, dsa_cache_seqlens, dsa_cu_seqlens_k,
                          seqlens_expanded=None, real_page_table=None, num_splits=None, flashmla_metadata=None):
    """Writes the sizes (from the sources' shapes) and source pointers of one step into the metadata
    params at `address` (device, mode and destinations set); a wrong source raises, naming it, with
    nothing written. Returns the views the params point into."""
    cdef dsa_metadata_copy_params* p = <dsa_metadata_copy_params*>address
    cdef int32_t dev = p.device
    cdef Arg cs, cu, pi, se, dc, du, rp, ns, fm
    cdef int64_t bs, n, meta = 0, k
    cdef int i
    cdef list keep = []
    bs = _length(cache_seqlens, &cs, "cache_seqlens", dev, keep)
    k = _length(cu_seqlens_k, &cu, "cu_seqlens_k", dev, keep)
    if k != bs + 1:
        raise _bad("cu_seqlens_k", f"expected {bs + 1} elements (bs + 1; bs: the length of cache_seqlens), got {k}")
    tensor(page_indices, &pi, "page_indices", I32, dev, 2, ANY, ANY, keep)
    se.data = rp.data = ns.data = fm.data = NULL
    if decode:
        if seqlens_expanded is not None:
            raise _bad("seqlens_expanded", "is not used in DECODE mode")
        if pi.shape[0] != bs:
            raise _bad("page_indices", f"DECODE copies bs = {bs} rows (the length of cache_seqlens) but page_indices has "
                                       f"{pi.shape[0]}")
        n = bs
    else:
        if seqlens_expanded is None:
            raise _bad("seqlens_expanded", "is required in TARGET_VERIFY and DRAFT_EXTEND modes")
        n = _length(seqlens_expanded, &se, "seqlens_expanded", dev, keep)
    k = _length(dsa_cache_seqlens, &dc, "dsa_cache_seqlens", dev, keep)
    if k != n:
        raise _bad("dsa_cache_seqlens", f"expected {n} elements (the length of {'cache_seqlens' if decode else 'seqlens_expanded'}), got {k}")
    k = _length(dsa_cu_seqlens_k, &du, "dsa_cu_seqlens_k", dev, keep)
    if k != n + 1:
        raise _bad("dsa_cu_seqlens_k", f"expected {n + 1} elements (one more than the length of "
                                           f"{'cache_seqlens' if decode else 'seqlens_expanded'}), got {k}")
    if (real_page_table is not None) != has_real_page_table:
        raise _bad("real_page_table", "must be given exactly when the destinations carry real_page_table")
    if real_page_table is not None:
        tensor(real_page_table, &rp, "real_page_table", I32, dev, 2, ANY, ANY, keep)
        if rp.shape[0] != pi.shape[0]:
            raise _bad("real_page_table", f"has {rp.shape[0]} rows but page_indices has {pi.shape[0]} (the rows of page_indices)")
    if ((num_splits is not None or flashmla_metadata is not None) != has_flashmla
            or (num_splits is None) != (flashmla_metadata is None)):
        raise _bad("num_splits/flashmla_metadata", "the FlashMLA group is all-or-nothing and must match the "
                   "destinations")
    if num_splits is not None:
        k = _length(num_splits, &ns, "num_splits", dev, keep)
        if k != n + 1:
            raise _bad("num_splits", f"expected {n + 1} elements (one more than the length of "
                                     f"{'cache_seqlens' if decode else 'seqlens_expanded'}), got {k}")
        read(flashmla_metadata, &fm, "flashmla_metadata", keep)
        tensor(flashmla_metadata, &fm, "flashmla_metadata", I32, dev, fm.ndim, ANY, ANY, keep)
        meta = 1
        for i in range(fm.ndim):
            meta *= fm.shape[i]
    _sources(p, bs=bs, rows=pi.shape[0], width=pi.shape[1], expanded=0 if decode else n,
             real_cols=rp.shape[1] if real_page_table is not None else 0, meta=meta, cs=&cs, cu=&cu, pi=&pi, se=&se,
             dc=&dc, du=&du, rp=&rp, ns=&ns, fm=&fm)
    return keep


cdef int _flat(object obj, Arg* a, str name, int32_t dev, int64_t need) except -1:
    """A contiguous int32 source on `dev` holding at least `need` elements (taken flat)."""
    cdef int64_t numel = 1
    cdef int i
    read(obj, a, name, None)
    if a.dtype != I32:
        raise RuntimeError(f"{name} must have dtype int32 (got {obj.dtype})")
    if a.dev != dev:
        raise ArgumentValueError(name, f"{name} is on {obj.device} but the destination buffers are on "
                         f"{'cpu' if dev < 0 else f'cuda:{dev}'}")
    if not a.contiguous:
        raise ArgumentValueError(name, f"{name} must be contiguous (got strides {obj.stride()})")
    for i in range(a.ndim):
        numel *= a.shape[i]
    if numel < need:
        raise ArgumentValueError(name, f"{name} holds {numel} elements but {need} are copied")
    return 0


def fill_flat_sources(uintptr_t address, *, bint decode, bint has_real_page_table, bint has_flashmla, tuple names,
                      tuple sizes, tuple sources):
    """Sizes given (`sizes`: bs, max_len, max_seqlen_k, expanded), every source read flat and holding at
    least what is copied, seqlens_expanded ignored in DECODE; `sources`: the nine sources in the order
    cache_seqlens, cu_seqlens_k, page_indices, dsa_cache_seqlens, seqlens_expanded, dsa_cu_seqlens_k,
    real_page_table, num_splits, flashmla_metadata; `names`: the caller's names of the nine sources and
    the four sizes, in these orders. Writes the sizes and source pointers into the metadata params at
    `address`; a wrong one raises, naming it, with nothing written."""
    cdef dsa_metadata_copy_params* p = <dsa_metadata_copy_params*>address
    cdef int32_t dev = p.device
    cdef Arg cs, cu, pi, se, dc, du, rp, ns, fm
    cdef int64_t rows, width, n, real_cols = 0, meta = 0, bs, max_len, max_seqlen_k, expanded
    cdef int i
    if len(sizes) != 4 or len(sources) != 9 or len(names) != 13:
        raise ValueError("fill_flat_sources takes 4 sizes, 9 sources and their 13 names")
    cache_seqlens, cu_seqlens_k, page_indices, dsa_cache_seqlens, seqlens_expanded, dsa_cu_seqlens_k, \
        real_page_table, num_splits, flashmla_metadata = sources
    for i in range(4):
        if type(sizes[i]) is not int:
            raise TypeError(f"{names[9 + i]} must be an int (got {type(sizes[i]).__name__} {sizes[i]!r})")
        if not 0 <= sizes[i] < 2**31:
            raise ValueError(f"{', '.join(names[9:12])} and {names[12]} must be in 0..2**31-1 (got "
                             f"{', '.join(map(str, sizes))})")
    bs, max_len, max_seqlen_k, expanded = sizes
    if (real_page_table is not None) != has_real_page_table:
        raise ArgumentValueError("real_page_table", "real_page_table: must be given exactly when the destinations carry real_page_table")
    if ((num_splits is not None or flashmla_metadata is not None) != has_flashmla
            or (num_splits is None) != (flashmla_metadata is None)):
        raise ValueError(f"{names[7]}/{names[8]}: the FlashMLA group is all-or-nothing and must match the "
                         f"destinations")
    n = bs if decode else expanded
    se.data = rp.data = ns.data = fm.data = NULL
    if decode:
        rows, width = bs, max_len
    else:
        read(page_indices, &pi, names[2], None)
        rows, width = (pi.shape[0] if pi.ndim >= 1 else 1), max_seqlen_k
    if real_page_table is not None:
        read(real_page_table, &rp, names[6], None)
        if rp.ndim < 2:
            raise ValueError(f"{names[6]} must be 2-D (got {list(real_page_table.shape)})")
        real_cols = rp.shape[1]
    if flashmla_metadata is not None:
        read(flashmla_metadata, &fm, names[8], None)
        meta = 1
        for i in range(fm.ndim):
            meta *= fm.shape[i]
    if rows >= 2**31 or real_cols >= 2**31:
        raise ValueError(f"{names[2]} / {names[6]} are too large to copy (rows {rows}, columns {real_cols})")
    _flat(cache_seqlens, &cs, names[0], dev, bs)
    _flat(cu_seqlens_k, &cu, names[1], dev, bs + 1)
    _flat(page_indices, &pi, names[2], dev, rows * width)
    _flat(dsa_cache_seqlens, &dc, names[3], dev, n)
    if not decode:
        _flat(seqlens_expanded, &se, names[4], dev, n)
    _flat(dsa_cu_seqlens_k, &du, names[5], dev, n + 1)
    if real_page_table is not None:
        _flat(real_page_table, &rp, names[6], dev, rows * real_cols)
    if num_splits is not None:
        _flat(num_splits, &ns, names[7], dev, n + 1)
        _flat(flashmla_metadata, &fm, names[8], dev, meta)
    _sources(p, bs=bs, rows=rows, width=width, expanded=0 if decode else n, real_cols=real_cols, meta=meta, cs=&cs,
             cu=&cu, pi=&pi, se=&se, dc=&dc, du=&du, rp=&rp, ns=&ns, fm=&fm)
    return None
