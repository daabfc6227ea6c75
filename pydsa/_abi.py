"""The loader of libdsa_kernels: the library is loaded once, from the installed package (or from $PYDSA_LIBRARY),
and checked against the header these modules were compiled with (its ABI version here; the size of each struct
where it is filled: the fillers' by the op table, pydsa/_read.pyx); a non-OK status becomes DsaError. The few
constants of the header Python itself needs are here; the structs live in the fillers, compiled against the header.
"""
from __future__ import annotations

import ctypes as C
import os
import sys
from importlib import resources

_BUILD_HINT = ("build it with `pip install --no-build-isolation -e .` (or `pip install .`) from the "
               "pydsa source tree, or point PYDSA_LIBRARY at a libdsa_kernels.so built from it")


def _shadowed() -> str | None:
    """Where an installed pydsa is, when this one was imported from a source tree without compiled modules
    (the current directory or PYTHONPATH shadowing the installed package), else None."""
    import glob
    import importlib.machinery
    here = os.path.dirname(os.path.abspath(__file__))
    if glob.glob(os.path.join(here, "_read*.so")) or not os.path.exists(os.path.join(here, "..", "pyproject.toml")):
        return None
    for entry in sys.path:
        folder = os.path.abspath(entry or os.getcwd())
        if folder == os.path.dirname(here):
            continue
        spec = importlib.machinery.PathFinder.find_spec(__package__, [folder])
        if spec is not None and spec.submodule_search_locations:
            found = list(spec.submodule_search_locations)[0]
            if glob.glob(os.path.join(found, "_read*.so")):
                return found
    return None


try:
    from . import _read
except ImportError as exc:
    _installed = _shadowed()
    if _installed is not None:
        raise ImportError(f"pydsa: this pydsa was imported from the source tree at "
                          f"{os.path.dirname(os.path.abspath(__file__))}, which shadows the installed package at "
                          f"{_installed} (the current directory or PYTHONPATH comes first on sys.path); run from "
                          f"another directory, or install the clone editable: pip install --no-build-isolation "
                          f"-e .") from exc
    # Python's own words for a module that is not there while pydsa is half-imported end in "(most likely due
    # to a circular import)", which would send the reader the wrong way: say what is missing instead
    missing = getattr(exc, "name", None) or str(exc).split(" (most likely")[0]
    raise ImportError(f"pydsa: the compiled modules are missing (no {missing}); {_BUILD_HINT}") from None

ABI_VERSION = _read.ABI_VERSION  # the header's, compiled into the binding
DEVICE_HOST = -1
CHUNK = 128
MAX_DESTINATIONS = 8
FLAG_PDL = 1

STATUS_OK = 0
STATUS_NAMES = {
    1: "invalid argument",
    2: "ABI mismatch",
    3: "capacity exceeded",
    4: "CUDA error",
    5: "no CUDA device",
}

MODE_DECODE, MODE_TARGET_VERIFY, MODE_DRAFT_EXTEND = 0, 1, 2


def _library_path() -> str:
    override = os.environ.get("PYDSA_LIBRARY")
    if override:
        return override
    packaged = resources.files(__package__).joinpath("libdsa_kernels.so")
    if packaged.is_file():
        return str(packaged)
    # Editable installs keep compiled files in site-packages beside the source package.
    for folder in getattr(sys.modules.get(__package__), "__path__", ()):
        candidate = os.path.join(folder, "libdsa_kernels.so")
        if os.path.isfile(candidate):
            return candidate
    return str(packaged)


def _load() -> C.CDLL:
    path = _library_path()
    if not os.path.exists(path):
        raise ImportError(f"pydsa: the shared library libdsa_kernels.so was not found at {path}; {_BUILD_HINT}")
    try:
        lib = C.CDLL(path)
    except OSError as exc:
        raise ImportError(f"pydsa: cannot load {path}: {exc}; {_BUILD_HINT}") from exc
    try:
        lib.dsa_abi_version.restype = C.c_int32
        lib.dsa_struct_size.restype = C.c_size_t
        lib.dsa_struct_size.argtypes = [C.c_int]
    except AttributeError as exc:
        raise ImportError(f"pydsa: {path} is not a libdsa_kernels build ({exc}); {_BUILD_HINT}") from exc
    found = lib.dsa_abi_version()
    if found != ABI_VERSION:
        raise ImportError(f"pydsa: {path} has ABI version {found} but this pydsa expects {ABI_VERSION} "
                          f"(a stale build); {_BUILD_HINT}")
    for name, restype in (("dsa_version_string", C.c_char_p), ("dsa_status_string", C.c_char_p),
                          ("dsa_last_error", C.c_char_p), ("dsa_cuda_architectures", C.c_char_p),
                          ("dsa_device_count", C.c_int32), ("dsa_c128_compress_capacity", C.c_int64),
                          ("dsa_cuda_runtime_version", C.c_int32), ("dsa_driver_version", C.c_int32),
                          ("dsa_kv_page_bytes", C.c_int64), ("dsa_indexer_page_bytes", C.c_int64),
                          ("dsa_c4_max_drafts", C.c_int32)):
        getattr(lib, name).restype = restype
    lib.dsa_status_string.argtypes = [C.c_int]
    lib.dsa_empty_launch.restype = C.c_int
    lib.dsa_empty_launch.argtypes = [C.c_int32, C.c_void_p]
    lib.dsa_c128_compress_capacity.argtypes = [C.c_int64, C.c_int64]
    lib.dsa_kv_page_bytes.argtypes = [C.c_int32, C.c_int32]
    lib.dsa_indexer_page_bytes.argtypes = [C.c_int32, C.c_int32]
    lib.dsa_c4_max_drafts.argtypes = [C.c_int32, C.c_int32]
    lib.dsa_c128_plan_prefill.restype = C.c_int  # takes a pointer to dsa_plan_params (C.byref)
    lib.path = path
    return lib


lib = _load()


def _pdl_everywhere() -> bool:
    """Whether every architecture the library holds launches with programmatic dependent launch
    (sm_90 and newer): then ops use it unless told otherwise. Every kernel waits for the previous
    kernel's writes before its first read, so PDL only lets its launch overlap the tail of the
    kernel before it."""
    archs = [a for a in lib.dsa_cuda_architectures().decode().replace("-real", "").replace("-virtual", "").split(",") if a]
    return bool(archs) and all(int("".join(ch for ch in a if ch.isdigit()) or 0) >= 90 for a in archs)


PDL_DEFAULT = _pdl_everywhere()
DEFAULT_PDL_FLAG = FLAG_PDL if PDL_DEFAULT else 0


class DsaError(RuntimeError):
    """A libdsa_kernels call returned a non-OK status; the message is dsa_last_error()."""

    def __init__(self, status: int, message: str):
        self.status = status
        super().__init__(f"{message} [{STATUS_NAMES.get(status, 'unknown status')}]")


def check(status: int) -> None:
    """Raises DsaError carrying dsa_last_error() for a non-OK status."""
    if status != STATUS_OK:
        raise DsaError(status, lib.dsa_last_error().decode())

