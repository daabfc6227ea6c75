"""C-ABI hygiene and reuse from other languages: exported symbols, the header as C99 and C++17,
struct_size checks, and real C and Rust consumers built against the library."""
import ctypes
import glob
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import c_structs
import pydsa
from pydsa import _abi

ROOT = Path(__file__).resolve().parents[1]
HEADER_DIR = ROOT / "native" / "include"
LIB = Path(pydsa.library_path())


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs nm")
def test_only_dsa_symbols_are_exported():
    lines = run(["nm", "-D", "--defined-only", str(LIB)]).stdout.splitlines()
    names = [line.split()[-1] for line in lines if line.strip()]
    assert names and all(n.startswith("dsa_") for n in names), [n for n in names if not n.startswith("dsa_")]


@pytest.mark.parametrize("compiler,flags", [("gcc", ["-x", "c", "-std=c99"]), ("g++", ["-x", "c++", "-std=c++17"])])
def test_header_compiles_cleanly(tmp_path, compiler, flags):
    if shutil.which(compiler) is None:
        pytest.skip(f"needs {compiler}")
    src = tmp_path / "h.c"
    src.write_text('#include "dsa_kernels.h"\nint main(void) { return dsa_abi_version() == DSA_ABI_VERSION ? 0 : 1; }\n')
    r = run([compiler, *flags, "-Wall", "-Wextra", "-Werror", "-pedantic", "-fsyntax-only", f"-I{HEADER_DIR}", str(src)])
    assert r.returncode == 0, r.stderr


def test_the_constants_python_keeps_are_the_headers():
    """The few header constants pydsa._abi keeps for Python have the header's values (the rest are read by the
    compiled modules from the header itself)."""
    for name in ("ABI_VERSION", "DEVICE_HOST", "CHUNK", "MAX_DESTINATIONS", "FLAG_PDL", "MODE_DECODE",
                 "MODE_TARGET_VERIFY", "MODE_DRAFT_EXTEND"):
        assert getattr(_abi, name) == c_structs.CONSTANTS[f"DSA_{name}"], name


def test_header_documents_the_abi_version_rule():
    text = (HEADER_DIR / "dsa_kernels.h").read_text()
    assert "ABI version rule" in text and "#define DSA_ABI_VERSION" in text


@pytest.mark.parametrize("fn,struct", [("dsa_c128_decode", c_structs.C128DecodeParams), ("dsa_c128_prefill", c_structs.C128PrefillParams),
                                       ("dsa_metadata_copy", c_structs.MetadataCopyParams), ("dsa_c128_plan_prefill", c_structs.PlanParams),
                                       ("dsa_c128_upload_plan", c_structs.PlanUploadParams)])
@pytest.mark.parametrize("delta", [-8, 8, -ctypes.sizeof(c_structs.C128DecodeParams)])
def test_wrong_struct_size_is_refused_with_a_clear_message(fn, struct, delta):
    p = c_structs.new(struct)
    p.struct_size = max(0, p.struct_size + delta)
    args = [ctypes.byref(p)] + ([] if fn == "dsa_c128_plan_prefill" else [None])
    assert getattr(_abi.lib, fn)(*args) == 2
    assert f"expects {ctypes.sizeof(struct)}" in _abi.lib.dsa_last_error().decode()


def test_the_test_mirrors_and_the_compiled_filler_lay_out_every_struct_as_the_library():
    import importlib
    import pkgutil

    import pydsa
    from pydsa import _read
    for m in pkgutil.iter_modules(pydsa.__path__):  # every filler declares its ops as it is imported
        if m.name.startswith("_fill_"):
            importlib.import_module(f"pydsa.{m.name}")
    assert set(c_structs.STRUCTS) == set(_read.OPS)  # a mirror for every op of the op table
    for op, mirror in c_structs.STRUCTS.items():
        sid = _read.PARAMS[op]
        assert _abi.lib.dsa_struct_size(sid) == ctypes.sizeof(mirror) == _read.SIZES[op], mirror.__name__


def test_the_structs_read_from_the_header_have_the_library_sizes():
    """Every dsa_struct_id of the header has a Structure read from the header, of the size the library reports;
    the fillers' own (op params and the structs they make) were compiled to those sizes too."""
    from pydsa import _read
    assert sorted(c_structs.BY_ID) == sorted(c_structs.STRUCT_IDS.values())
    for sid, struct in c_structs.BY_ID.items():
        assert _abi.lib.dsa_struct_size(sid) == ctypes.sizeof(struct), struct.__name__
    for name, (sid, size) in _read.STRUCTS.items():
        assert c_structs.BY_ID[sid].__name__ == c_structs._class_name(f"dsa_{name}") and ctypes.sizeof(c_structs.BY_ID[sid]) == size


def test_a_struct_of_another_layout_is_told_apart():
    """The header reader follows the header: a member appended to a struct (a layout the library does not have)
    gives a Structure whose size the library's disagrees with."""
    text = c_structs.HEADER.read_text().replace("  int32_t dcp_rank;\n} dsa_kv_cache;",
                                                "  int32_t dcp_rank;\n  int64_t appended;\n} dsa_kv_cache;")
    structs, _, ids = c_structs.read_header(text)
    assert ctypes.sizeof(structs["dsa_kv_cache"]) != _abi.lib.dsa_struct_size(ids["DSA_STRUCT_KV_CACHE"])
    assert ctypes.sizeof(structs["dsa_kv_store_params"]) == _abi.lib.dsa_struct_size(ids["DSA_STRUCT_KV_STORE_PARAMS"])


def test_null_params_are_refused():
    assert _abi.lib.dsa_c128_decode(None, None) == 1
    assert "params is null" in _abi.lib.dsa_last_error().decode()


def _build_tree():
    trees = sorted(glob.glob(str(ROOT / "build" / "*" / "CMakeCache.txt")))
    return Path(trees[-1]).parent if trees else None


@pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")
def test_c_consumer_builds_against_the_installed_package(tmp_path):
    """cmake --install lays out header, library, CMake package and pkg-config file; a separate
    CMake project finds it with find_package(dsa_kernels) and its C99 consumer passes."""
    tree = _build_tree()
    if tree is None:
        pytest.skip("no CMake build tree (install with `pip install --no-build-isolation -e .`)")
    prefix = tmp_path / "prefix"
    r = run(["cmake", "--install", str(tree), "--prefix", str(prefix)])
    assert r.returncode == 0, r.stderr
    pkg = prefix / "pydsa"
    for f in ("include/dsa_kernels.h", "libdsa_kernels.so", "lib/cmake/dsa_kernels/dsa_kernelsConfig.cmake",
              "lib/pkgconfig/dsa_kernels.pc"):
        assert (pkg / f).exists(), f
    _consume(pkg, tmp_path)


def _consume(prefix: Path, tmp_path: Path) -> None:
    """Builds and runs the C99 consumer against the package at `prefix` through its CMake package
    and through pkg-config."""
    build = tmp_path / "consumer"
    r = run(["cmake", "-S", str(ROOT / "examples" / "c"), "-B", str(build), f"-DCMAKE_PREFIX_PATH={prefix}"])
    assert r.returncode == 0, r.stdout + r.stderr
    r = run(["cmake", "--build", str(build)])
    assert r.returncode == 0, r.stdout + r.stderr
    r = run([str(build / "consumer")])
    assert r.returncode == 0 and "dsa_kernels C consumer: OK" in r.stdout, r.stdout + r.stderr
    if shutil.which("pkg-config"):
        flags = run(["pkg-config", "--cflags", "--libs", "dsa_kernels"],
                    env={**os.environ, "PKG_CONFIG_PATH": str(prefix / "lib" / "pkgconfig")}).stdout.split()
        exe = tmp_path / "consumer_pc"
        r = run(["gcc", "-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", str(ROOT / "examples" / "c" / "consumer.c"),
                 *flags, f"-Wl,-rpath,{prefix}", "-lm", "-o", str(exe)])
        assert r.returncode == 0, r.stderr
        assert "OK" in run([str(exe)]).stdout


@pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")
def test_c_consumer_builds_against_the_package_in_site_packages(tmp_path):
    """The installed package itself (wheel or editable install) is a CMake and pkg-config prefix:
    CMAKE_PREFIX_PATH=<site-packages>/pydsa finds the header, the library and the package files."""
    prefix = LIB.parent
    if not (prefix / "lib" / "cmake" / "dsa_kernels" / "dsa_kernelsConfig.cmake").exists():
        pytest.skip(f"the library at {LIB} was not installed as a package (PYDSA_LIBRARY or a bare build)")
    assert (prefix / "include" / "dsa_kernels.h").exists()
    _consume(prefix, tmp_path)


@pytest.mark.skipif(shutil.which("cargo") is None, reason="cargo is not installed")
def test_rust_consumer_builds_and_passes(tmp_path):
    env = {**os.environ, "DSA_KERNELS_LIB_DIR": str(LIB.parent), "CARGO_TARGET_DIR": str(tmp_path / "target")}
    r = run(["cargo", "run", "--quiet", "--offline", "--manifest-path", str(ROOT / "examples" / "rust" / "Cargo.toml")], env=env)
    assert r.returncode == 0 and "dsa_kernels Rust consumer: OK" in r.stdout, r.stdout + r.stderr
