"""ctypes Structures of every struct of native/include/dsa_kernels.h, read from the header itself, for tests that call
the C entry points directly as a C caller would (the library's fillers, pydsa/_fill_*.pyx, are compiled against the
header). Nothing here is written by hand: a new op's params struct is here once the header declares it.

Each `typedef struct dsa_<name> { ... } dsa_<name>;` becomes the class <Name> (dsa_kv_cache: KvCache,
dsa_c128_decode_params: C128DecodeParams); every pointer a c_void_p, a nested struct its class, `x[N]` an array.
BY_ID: each dsa_struct_id (DSA_STRUCT_<X>) -> its Structure: the struct of an op's entry point for the ids of the op
table, else dsa_<x>. STRUCTS: each op of the op table (pydsa._read.OPS) -> its params' Structure."""
import ctypes as C
import importlib
import pkgutil
import re
from pathlib import Path

HEADER = Path(__file__).resolve().parents[1] / "native" / "include" / "dsa_kernels.h"

_SCALARS = {"uint8_t": C.c_uint8, "uint16_t": C.c_uint16, "uint32_t": C.c_uint32, "uint64_t": C.c_uint64,
            "int8_t": C.c_int8, "int16_t": C.c_int16, "int32_t": C.c_int32, "int64_t": C.c_int64,
            "float": C.c_float, "double": C.c_double}


def _class_name(c_name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in c_name.removeprefix("dsa_").split("_"))


def _field(declaration: str, structs: dict):
    """(name, ctypes type) of one member declaration, e.g. `const float* ape`, `void* const* states` or
    `dsa_c4_compressor compressors[2]`."""
    words = re.sub(r"\bconst\b", " ", declaration).replace("*", " * ").split()  # void* const* states: void * * states
    m = re.fullmatch(r"(\w+)((?: \*)*) (\w+)(?:\[(\w+)\])?", " ".join(words))
    if m is None:
        raise ValueError(f"{HEADER.name}: cannot read the member `{declaration}`")
    c_type, stars, name, count = m.groups()
    if stars:
        kind = C.c_void_p
    elif c_type in _SCALARS:
        kind = _SCALARS[c_type]
    elif c_type in structs:
        kind = structs[c_type]
    else:
        raise ValueError(f"{HEADER.name}: member `{declaration}` has a type this reader does not know")
    return name, kind * int(count) if count else kind


def read_constants(text: str) -> dict:
    """The header's numeric #defines and enum values, by name (DSA_FLAG_PDL: 1)."""
    defines = {m[1]: int(m[2], 0) for m in re.finditer(r"^#define (DSA_\w+) \(?(-?(?:0x)?[0-9A-Fa-f]+)u?\)?", text, re.M)}
    return {**defines, **{m[1]: int(m[2]) for m in re.finditer(r"\b(DSA_\w+)\s*=\s*(\d+)", text)}}


def read_header(text: str):
    """(structs: C name -> Structure in the header's order, entry params: entry symbol -> C name of its params,
    struct ids: DSA_STRUCT_<X> -> value)."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    structs = {}
    for c_name, body, closing in re.findall(r"typedef\s+struct\s+(\w+)\s*\{(.*?)\}\s*(\w+)\s*;", text, flags=re.S):
        assert c_name == closing, (c_name, closing)
        fields = [_field(" ".join(d.split()), structs) for d in body.split(";") if d.strip()]
        structs[c_name] = type(_class_name(c_name), (C.Structure,), {"_fields_": fields})
    entries = dict((symbol, params) for symbol, params in
                   re.findall(r"DSA_API\s+dsa_status\s+(dsa_\w+)\s*\(\s*const\s+(dsa_\w+)\s*\*", text))
    ids = {name: int(value) for name, value in re.findall(r"\b(DSA_STRUCT_\w+)\s*=\s*(\d+)", text)}
    return structs, entries, ids


_structs, ENTRY_PARAMS, STRUCT_IDS = read_header(HEADER.read_text())
globals().update({cls.__name__: cls for cls in _structs.values()})
CONSTANTS = read_constants(HEADER.read_text())


def new(struct_type):
    """A zeroed params struct with struct_size set, as a C caller makes one."""
    return struct_type(struct_size=C.sizeof(struct_type))


def _op_table():
    import pydsa
    from pydsa import _read
    for m in pkgutil.iter_modules(pydsa.__path__):  # every filler declares its ops as it is imported
        if m.name.startswith("_fill_"):
            importlib.import_module(f"pydsa.{m.name}")
    return _read


_read = _op_table()
STRUCTS = {op: _structs[ENTRY_PARAMS[_read.SYMBOLS[op]]] for op in _read.OPS}
BY_ID = {sid: _structs[f"dsa_{name.removeprefix('DSA_STRUCT_').lower()}"] for name, sid in STRUCT_IDS.items()
         if f"dsa_{name.removeprefix('DSA_STRUCT_').lower()}" in _structs}
BY_ID.update({_read.PARAMS[op]: struct for op, struct in STRUCTS.items()})


def kv_cache(kv) -> "KvCache":
    """A KVCache's dsa_kv_cache, as a C caller holding its address sees (and may set) it."""
    return KvCache.from_address(kv.address)  # noqa: F821 (read from the header)
