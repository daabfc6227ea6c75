"""ctypes mirrors of the op params structs of dsa_kernels.h, for tests that call the C entry points
directly as a C caller would (the library fills these through the fillers, pydsa/_fill_*.pyx)."""
import ctypes as C

from pydsa._abi import MetadataSources

class KvCache(C.Structure):
    _fields_ = [
        ("struct_size", C.c_uint32), ("layout", C.c_int32),
        ("cache", C.c_void_p), ("num_pages", C.c_int64), ("page_size", C.c_int32), ("eps", C.c_float),
        ("norm_weight", C.c_void_p), ("rotary", C.c_void_p), ("num_positions", C.c_int64),
        ("dcp_world", C.c_int32), ("dcp_rank", C.c_int32),
    ]


def kv_cache(kv) -> KvCache:
    """A KVCache's dsa_kv_cache, as a C caller holding its address sees (and may set) it."""
    return KvCache.from_address(kv.address)


class PlanUploadParams(C.Structure):
    _fields_ = [
        ("struct_size", C.c_uint32), ("device", C.c_int32),
        ("compress", C.c_void_p), ("write", C.c_void_p),
        ("num_compress", C.c_int64), ("num_write", C.c_int64),
        ("device_compress", C.c_void_p), ("device_write", C.c_void_p),
        ("compress_capacity", C.c_int64), ("write_capacity", C.c_int64),
        ("device_counts", C.c_void_p),
    ]


class DecodeParams(C.Structure):
    _fields_ = [
        ("struct_size", C.c_uint32), ("flags", C.c_uint32),
        ("device", C.c_int32), ("head_dim", C.c_int32),
        ("num_slots", C.c_int64), ("batch_size", C.c_int64),
        ("state", C.c_void_p), ("kv_score", C.c_void_p), ("out", C.c_void_p), ("ape", C.c_void_p),
        ("indices", C.c_void_p), ("seq_lens", C.c_void_p), ("error_count", C.c_void_p),
        ("state_dtype", C.c_int32), ("reserved", C.c_int32), ("load_indices", C.c_void_p),
        ("store", C.c_void_p), ("cache_slots", C.c_void_p),
    ]


class VerifyParams(C.Structure):
    _fields_ = [
        ("struct_size", C.c_uint32), ("flags", C.c_uint32),
        ("device", C.c_int32), ("head_dim", C.c_int32),
        ("num_slots", C.c_int64), ("batch_size", C.c_int64),
        ("num_drafts", C.c_int32), ("state_dtype", C.c_int32),
        ("state", C.c_void_p), ("kv_score", C.c_void_p), ("out", C.c_void_p), ("ape", C.c_void_p),
        ("seq_lens", C.c_void_p), ("verify_lens", C.c_void_p), ("indices", C.c_void_p),
        ("bank_indices", C.c_void_p), ("bank_stride", C.c_int64), ("error_count", C.c_void_p),
        ("store", C.c_void_p), ("cache_slots", C.c_void_p),
    ]


class CommitParams(C.Structure):
    _fields_ = [
        ("struct_size", C.c_uint32), ("flags", C.c_uint32),
        ("device", C.c_int32), ("head_dim", C.c_int32),
        ("num_slots", C.c_int64), ("batch_size", C.c_int64),
        ("num_drafts", C.c_int32), ("state_dtype", C.c_int32),
        ("seq_lens", C.c_void_p), ("accepted", C.c_void_p), ("verify_lens", C.c_void_p),
        ("indices", C.c_void_p), ("bank_indices", C.c_void_p), ("bank_stride", C.c_int64),
        ("load_indices", C.c_void_p), ("num_layers", C.c_int32), ("reserved", C.c_int32),
        ("states", C.c_void_p), ("error_count", C.c_void_p),
    ]


class PrefillParams(C.Structure):
    _fields_ = [
        ("struct_size", C.c_uint32), ("flags", C.c_uint32),
        ("device", C.c_int32), ("head_dim", C.c_int32),
        ("num_slots", C.c_int64), ("batch_size", C.c_int64), ("num_tokens", C.c_int64),
        ("state", C.c_void_p), ("kv_score", C.c_void_p), ("out", C.c_void_p), ("ape", C.c_void_p),
        ("indices", C.c_void_p), ("load_indices", C.c_void_p),
        ("compress", C.c_void_p), ("write", C.c_void_p),
        ("compress_capacity", C.c_int64), ("write_capacity", C.c_int64),
        ("counts", C.c_void_p), ("error_count", C.c_void_p),
        ("state_dtype", C.c_int32), ("out_layout", C.c_int32),
        ("store", C.c_void_p), ("cache_slots", C.c_void_p),
    ]


class KvStoreParams(C.Structure):
    _fields_ = [
        ("struct_size", C.c_uint32), ("flags", C.c_uint32), ("device", C.c_int32), ("head_dim", C.c_int32),
        ("num_vectors", C.c_int64), ("vectors", C.c_void_p), ("positions", C.c_void_p),
        ("cache_slots", C.c_void_p), ("cache", C.c_void_p), ("error_count", C.c_void_p),
        ("records", C.c_void_p), ("num_cache_slots", C.c_int64), ("ratio", C.c_int32), ("reserved", C.c_int32),
    ]


class MetadataCopyParams(C.Structure):
    _fields_ = [
        ("struct_size", C.c_uint32), ("flags", C.c_uint32),
        ("device", C.c_int32), ("mode", C.c_int32),
        ("bs", C.c_int64), ("page_rows", C.c_int64), ("page_width", C.c_int64),
        ("expanded", C.c_int64), ("real_cols", C.c_int64), ("metadata_size", C.c_int64),
        ("src", MetadataSources),
        ("num_destinations", C.c_int32), ("reserved", C.c_int32),
        ("destinations", C.c_void_p),
    ]


# each op's params mirror, by the op's name in the op table (pydsa._read.OPS)
STRUCTS = {"decode": DecodeParams, "prefill": PrefillParams, "metadata": MetadataCopyParams, "upload": PlanUploadParams,
           "verify": VerifyParams, "commit": CommitParams, "store": KvStoreParams}


class RecordsParams(C.Structure):
    _fields_ = [
        ("struct_size", C.c_uint32), ("flags", C.c_uint32), ("device", C.c_int32), ("kind", C.c_int32),
        ("batch_size", C.c_int64), ("state_slot_offset", C.c_int64), ("req_pool_indices", C.c_void_p),
        ("slots", C.c_void_p), ("load_slots", C.c_void_p), ("seq_lens", C.c_void_p), ("plan_d", C.c_void_p),
        ("seq_lens_out", C.c_void_p), ("compress", C.c_void_p), ("write", C.c_void_p),
        ("num_compress", C.c_int64), ("num_write", C.c_int64), ("plan_c", C.c_void_p), ("plan_w", C.c_void_p),
        ("compress_rows", C.c_int64), ("write_rows", C.c_int64), ("error_count", C.c_void_p),
    ]


STRUCTS["records"] = RecordsParams


class C4Compressor(C.Structure):
    _fields_ = [
        ("head_dim", C.c_int32), ("reserved", C.c_int32), ("ring", C.c_void_p), ("ring_rows", C.c_int64),
        ("kv_score", C.c_void_p), ("ape", C.c_void_p), ("out", C.c_void_p), ("store", C.c_void_p),
    ]


class C4Params(C.Structure):
    _fields_ = [
        ("struct_size", C.c_uint32), ("flags", C.c_uint32), ("device", C.c_int32), ("num_compressors", C.c_int32),
        ("ring_dtype", C.c_int32), ("ring_size", C.c_int32), ("batch_size", C.c_int64), ("num_tokens", C.c_int64),
        ("decode_records", C.c_void_p), ("compress", C.c_void_p), ("write", C.c_void_p),
        ("num_compress", C.c_int64), ("num_write", C.c_int64), ("seq_lens", C.c_void_p), ("slots", C.c_void_p),
        ("num_drafts", C.c_int32), ("reserved", C.c_int32), ("cache_slots", C.c_void_p), ("error_count", C.c_void_p),
        ("compressors", C4Compressor * 2),
    ]


STRUCTS.update(c4_decode=C4Params, c4_extend=C4Params, c4_verify=C4Params)


class C4PlanParams(C.Structure):
    _fields_ = [
        ("struct_size", C.c_uint32), ("flags", C.c_uint32), ("device", C.c_int32), ("use_req_ring", C.c_int32),
        ("swa_page_size", C.c_int32), ("ring_size", C.c_int32), ("batch_size", C.c_int64),
        ("req_pool_indices", C.c_void_p), ("req_to_token", C.c_void_p), ("token_rows", C.c_int64),
        ("token_cols", C.c_int64), ("token_stride", C.c_int64), ("full_to_state", C.c_void_p),
        ("num_full", C.c_int64), ("seq_lens", C.c_void_p), ("extend_lens", C.c_void_p),
        ("seq_lens_int32", C.c_int32), ("extend_lens_int32", C.c_int32), ("num_tokens", C.c_int64),
        ("plan_d", C.c_void_p), ("plan_c", C.c_void_p), ("plan_w", C.c_void_p),
    ]


STRUCTS.update(c4_plan_decode=C4PlanParams, c4_plan_extend=C4PlanParams)


class C128OfflineParams(C.Structure):
    _fields_ = [
        ("struct_size", C.c_uint32), ("flags", C.c_uint32), ("device", C.c_int32), ("head_dim", C.c_int32),
        ("ring_dtype", C.c_int32), ("ring_size", C.c_int32), ("ring", C.c_void_p), ("ring_rows", C.c_int64),
        ("kv_score", C.c_void_p), ("ape", C.c_void_p), ("out", C.c_void_p), ("batch_size", C.c_int64),
        ("num_tokens", C.c_int64), ("decode_records", C.c_void_p), ("compress", C.c_void_p), ("write", C.c_void_p),
        ("num_compress", C.c_int64), ("num_write", C.c_int64), ("seq_lens", C.c_void_p), ("slots", C.c_void_p),
        ("store", C.c_void_p), ("cache_slots", C.c_void_p), ("error_count", C.c_void_p),
    ]


STRUCTS.update(c128_offline_decode=C128OfflineParams, c128_offline_extend=C128OfflineParams)
