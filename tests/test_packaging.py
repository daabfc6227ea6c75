"""The distribution's name: its own (the package index's `pydsa` is an unrelated project), declared once
in pyproject.toml, and the one `python -m pydsa info` reports for the installed package."""
import importlib.metadata as md
import pathlib
import subprocess
import sys

import pytest

from pydsa import info

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _declared_name():
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"]


def test_the_distribution_is_not_the_index_s_unrelated_pydsa():
    assert _declared_name() == "dsa-kernels"


def test_info_reports_the_installed_distribution():
    found = info.distribution()
    assert found is not None, "pydsa is imported without its installed distribution"
    name, version = found.split()
    assert md.version(name) == version
    if (ROOT / "pyproject.toml").exists():
        assert name == _declared_name()
    out = subprocess.run([sys.executable, "-m", "pydsa", "info"], capture_output=True, text=True, check=True).stdout
    assert f"distribution: {name} {version}" in out.splitlines()[0]


def test_readme_installs_the_distribution_by_its_own_name():
    readme = (ROOT / "README.md").read_text()
    assert "pip install pydsa" not in readme and "pip install -U pydsa" not in readme
    assert "dsa_kernels-*" in readme


def test_the_c_library_speaks_only_of_itself_and_no_python_file_is_a_hub():
    """native/ never names another framework (its record formats are pydsa's own, docs/spec.md); no file
    of the Python packages exceeds 500 lines."""
    root = pathlib.Path(__file__).resolve().parents[1]
    named = [str(f.relative_to(root)) for f in (root / "native").rglob("*") if f.is_file()
             and "sglang" in f.read_text(errors="replace").lower()]
    assert named == []
    long = {str(f.relative_to(root)): n for folder in ("pydsa", "pyplan") for f in (root / folder).rglob("*")
            if f.suffix in (".py", ".pyx", ".pxd") and (n := len(f.read_text().splitlines())) > 500}
    assert long == {}
