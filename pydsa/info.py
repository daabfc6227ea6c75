"""`python -m pydsa info`: what was loaded and what it can run on; whether the `pydsa` and `pyplan` Python finds
are this project's (the package index's `pydsa` and `pyplan` are unrelated projects of the same names), with a
repair that works from where this project was installed (its clone or its wheel file: dsa-kernels is built from
the clone and is on no package index)."""
from __future__ import annotations

import argparse
import os
import sys

DISTRIBUTION = "dsa-kernels"
PACKAGES = ("pydsa", "pyplan")
NAMESAKES = {"pydsa": "a DSA signature library", "pyplan": "a capital-planning tool"}
# A line only this project's package holds: pydsa loads the library through _abi, pyplan the compiled planner.
SIGNATURES = {"pydsa": "from ._abi import", "pyplan": "from ._plan import"}
ORIGIN = (f"this project's pydsa and pyplan come from the distribution {DISTRIBUTION}, built from its clone (it is on "
          f"no package index, whose pydsa and pyplan are unrelated projects)")


def distribution() -> str | None:
    """The installed distribution that provides this package ("dsa-kernels <version>"), or None: the one
    that declares its sglang plugin entry point (found alike for a wheel and an editable install)."""
    import importlib.metadata as md
    for ep in md.entry_points(group="sglang.srt.plugins"):
        if ep.value.startswith(__package__ + ".") and ep.dist is not None:
            return f"{ep.dist.name} {ep.dist.version}"
    return None


def installed_from(dist=None) -> tuple:
    """Where this project was installed from: ("editable", the clone), ("wheel", the wheel file), ("folder", the
    folder pip built it from), ("clone", the clone) when nothing is installed and pydsa is a clone's source
    tree, or ("unknown", None). dist: the distribution to read (tests)."""
    import importlib.metadata as md
    import json
    from urllib.parse import unquote, urlparse
    if dist is None:
        try:
            dist = md.distribution(DISTRIBUTION)
        except md.PackageNotFoundError:
            clone = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            return ("clone", clone) if os.path.isfile(os.path.join(clone, "pyproject.toml")) else ("unknown", None)
    try:
        url = json.loads(dist.read_text("direct_url.json") or "{}")
    except ValueError:
        url = {}
    where = urlparse(url.get("url", ""))
    path = unquote(where.path) if where.scheme == "file" else url.get("url")
    if not path:
        return "unknown", None
    if url.get("dir_info", {}).get("editable"):
        return "editable", path
    return ("wheel" if path.endswith(".whl") else "folder" if "dir_info" in url else "unknown"), path


def repair(remove: str | None = None, dist=None) -> str:
    """The commands that put this project's pydsa and pyplan back from where they were installed: first
    `pip uninstall -y <remove>` (the distribution in the way), then the reinstall from the clone or wheel."""
    kind, path = installed_from(dist)
    first = f"pip uninstall -y {remove} && " if remove else ""
    if kind in ("editable", "clone"):
        return f"repair, in the clone {path}: `{first}pip install --no-build-isolation -e .` (or `bash setup.sh`)"
    if kind == "wheel":
        return f"repair: `{first}pip install --force-reinstall --no-deps {path}`"
    if kind == "folder":
        return f"repair: `{first}pip install --force-reinstall --no-deps --no-build-isolation {path}`"
    return (f"repair: {f'`{first[:-4]}`, then ' if remove else ''}reinstall {DISTRIBUTION} from its clone (`pip install "
            f"--no-build-isolation -e .` or `bash setup.sh` there) or from its wheel file (`pip install "
            f"--force-reinstall --no-deps <the dsa_kernels wheel>`)")


def _owner(path: str):
    """The installed distribution other than this project's that lists the file at `path`, or None."""
    import importlib.metadata as md
    path = os.path.realpath(path)
    for dist in md.distributions():
        name = dist.metadata["Name"] or ""
        if name.lower().replace("_", "-") == DISTRIBUTION:
            continue
        for f in dist.files or ():
            if f.name == os.path.basename(path) and os.path.realpath(f.locate()) == path:
                return dist
    return None


def namesakes(packages=PACKAGES) -> list:
    """Sentences, each with its repair, for a `pydsa` or `pyplan` that Python imports (or would) and that is not
    this project's: the package index's namesake, another project's, or one whose __init__.py is gone. Executes
    nothing of the packages it judges, so it can run before anything imports pyplan."""
    import importlib.util
    problems = []
    for package in packages:
        module = sys.modules.get(package)
        if module is not None:
            origin, folders = getattr(module, "__file__", None), list(getattr(module, "__path__", ()))
        else:
            try:
                spec = importlib.util.find_spec(package)
            except (ImportError, ValueError):
                continue
            if spec is None:
                continue  # not there at all: the import says so
            origin, folders = spec.origin, list(spec.submodule_search_locations or ())
        if origin is not None and os.path.isfile(origin) and not origin.endswith(".py"):
            continue  # compiled only: nothing to read the signature from
        if origin is None or not os.path.isfile(origin):
            problems.append(f"{package}/__init__.py is missing (the package folders Python finds: "
                            f"{', '.join(folders) or 'none'}; uninstalling a namesake of the same name removes it); "
                            f"{ORIGIN}; " + repair())
            continue
        try:
            with open(origin, encoding="utf-8", errors="replace") as fh:
                ours = SIGNATURES[package] in fh.read()
        except OSError:
            continue
        if ours:
            continue
        owner = _owner(origin)
        if owner is None:
            found = (f"a package outside any installed distribution; {ORIGIN}; repair: take "
                     f"{os.path.dirname(os.path.dirname(origin))} off sys.path (run from another directory, or drop it "
                     f"from PYTHONPATH)")
        else:
            name = owner.metadata["Name"]
            index = (f", the package index's {package}: {NAMESAKES[package]}, unrelated to this project"
                     if name.lower() == package else "")
            found = f"the distribution {name} {owner.version}{index}; {ORIGIN}; " + repair(remove=name)
        problems.append(f"the `{package}` that Python imports ({origin}) is not this project's but {found}")
    return problems


def refuse_namesakes() -> None:
    """One ImportError naming each namesake Python would import instead of this project's pydsa or pyplan."""
    found = namesakes()
    if found:
        raise ImportError("pydsa: " + "\npydsa: ".join(found))


def _digest(path) -> str:
    import base64
    import hashlib
    with open(path, "rb") as fh:
        return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(fh.read()).digest()).rstrip(b"=").decode()


def replaced_files(dist=None, others=None) -> list:
    """Sentences naming each file of pydsa / pyplan that is not the installed distribution's own (its hash
    differs from the RECORD, it is missing, or another installed distribution also claims it), with the
    repair; [] for an intact install or a source tree. dist / others: the distributions to compare (tests)."""
    import importlib.metadata as md
    if dist is None:
        try:
            dist = md.distribution(DISTRIBUTION)
        except md.PackageNotFoundError:
            return []
    problems = []
    ours = {str(f) for f in dist.files or () if f.parts and f.parts[0] in PACKAGES}
    for f in dist.files or ():
        if str(f) not in ours or not f.hash:
            continue
        path = f.locate()
        if not path.exists():
            problems.append(f"{f} of {DISTRIBUTION} is missing; " + repair(dist=dist))
        elif _digest(path) != f"{f.hash.mode}={f.hash.value}":
            problems.append(f"{f} is not {DISTRIBUTION}' file (another package overwrote it); "
                            + repair("<the other package>", dist))
    for other in (md.distributions() if others is None else others):
        name = other.metadata["Name"]
        if name is None or name.lower().replace("_", "-") == DISTRIBUTION:
            continue
        clash = sorted({str(f) for f in other.files or ()} & ours)
        if clash:
            what = NAMESAKES.get(clash[0].split("/")[0], "another project")
            problems.append(f"the distribution {name} {other.version} ({what}) also installs {clash[0]}"
                            f"{f' and {len(clash) - 1} more' if len(clash) > 1 else ''}, over {DISTRIBUTION}' own; "
                            + repair(name, dist))
    return problems


def namesakes_beside() -> list:
    """Sentences for the package index's pydsa and pyplan installed beside this project while Python still
    imports this project's packages (as an editable install's finder does)."""
    import importlib.metadata as md
    notes = []
    for package, what in NAMESAKES.items():
        try:
            other = md.distribution(package)
        except md.PackageNotFoundError:
            continue
        notes.append(f"the distribution {package} {other.version} (the package index's {package}: {what}, unrelated "
                     f"to this project) is installed too; Python imports this project's {package} here, but a wheel "
                     f"install would share files with it: `pip uninstall -y {package}` unless you need it")
    return notes


def install_problems() -> list:
    """What stands between the user and this project's pydsa and pyplan: namesakes Python imports instead of
    them, else files of the install that another package replaced or removed."""
    return namesakes() or replaced_files()


def main(argv=None) -> int:
    import torch

    from . import _abi
    argparse.ArgumentParser(prog="python -m pydsa info").parse_args(argv)
    problems = install_problems()
    for p in problems:
        print(f"pydsa info: BROKEN INSTALL: {p}")
    lib = _abi.lib
    print(f"pydsa {lib.dsa_version_string().decode()} (ABI {lib.dsa_abi_version()}), "
          f"distribution: {distribution() or 'none (imported from a source tree, not installed)'}")
    print(f"library: {lib.path}")
    prefix = os.path.dirname(lib.path)
    print(f"C/C++ prefix: {prefix} (CMAKE_PREFIX_PATH={prefix}, PKG_CONFIG_PATH={prefix}/lib/pkgconfig, "
          f"DSA_KERNELS_LIB_DIR={prefix})")
    archs = lib.dsa_cuda_architectures().decode()
    real = [a.split("-")[0] for a in archs.split(",") if a and not a.endswith("-virtual")]
    ptx = [a.split("-")[0] for a in archs.split(",") if a and not a.endswith("-real")]
    print(f"compiled CUDA architectures: {archs or 'none'} (machine code: "
          f"{', '.join('sm_' + a for a in real) or 'none'}; PTX, JIT-compiled by newer GPUs: "
          f"{', '.join('compute_' + a for a in ptx) or 'none'})")
    runtime, driver = lib.dsa_cuda_runtime_version(), lib.dsa_driver_version()
    fmt = lambda v: f"{v // 1000}.{v % 1000 // 10}"  # noqa: E731
    if runtime:
        print(f"CUDA runtime {fmt(runtime)}, linked statically: needs an NVIDIA driver for CUDA {fmt(runtime)} or "
              f"newer; driver found: {fmt(driver) if driver else 'none'}")
    n = lib.dsa_device_count()
    if n == 0:
        print("GPU: none found (ops run on the host backend for CPU tensors)")
    for i in range(n):
        props = torch.cuda.get_device_properties(i) if torch.cuda.is_available() else None
        if props is not None:
            print(f"GPU {i}: {props.name}, sm_{props.major}{props.minor}, {props.total_memory / 2**30:.0f} GiB, "
                  f"{props.multi_processor_count} SMs")
        else:
            print(f"GPU {i}: present (torch sees no CUDA)")
    print(f"torch {torch.__version__}, CUDA available to torch: {torch.cuda.is_available()}")
    for note in [] if problems else namesakes_beside():
        print(f"pydsa info: note: {note}")
    return 1 if problems else 0
