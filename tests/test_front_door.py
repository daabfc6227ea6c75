"""What a new user meets first: odd demo flags, silent acceptances turned into named errors, and the sglang
layer's errors in sglang's own argument names (the shapes the caller passed, not pydsa's reshaped ones)."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

import pydsa
from pydsa import _fill_records, sglang as S
from pydsa._abi import DEFAULT_PDL_FLAG

R2T = torch.zeros(4, 8, dtype=torch.int32)


def _demo(*args, tmp=None):
    return subprocess.run([sys.executable, "-m", "pydsa", "demo", "--steps", "3", "--requests", "3", *args],
                          capture_output=True, text=True)


@pytest.mark.parametrize("flag, says", [(["--device", "meta"], "--device meta"), (["--seed", "-1"], "--seed"),
                                        (["--json", "/no/such/folder/x.json"], "--json /no/such/folder/x.json"),
                                        (["--steps", "0"], "--steps")])
def test_odd_demo_flags_are_one_line_errors_before_the_run(flag, says):
    r = _demo(*flag)
    assert r.returncode == 2 and "Traceback" not in r.stderr and says in r.stderr.strip().splitlines()[-1]
    assert "PASS" not in r.stdout


def test_demo_json_is_strict(tmp_path):
    out = tmp_path / "demo.json"
    r = _demo("--json", str(out), "--device", "cpu")
    assert r.returncode == 0, r.stdout + r.stderr
    text = out.read_text()
    assert "NaN" not in text and "Infinity" not in text
    summary = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert summary["ok"] is True


def test_metadata_copy_refuses_an_unknown_destination_key():
    d = {k: torch.zeros(8, dtype=torch.int32) for k in ("cache_seqlens", "cu_seqlens_k", "dsa_cache_seqlens",
                                                         "dsa_cu_seqlens_k")}
    d["page_table_1"] = torch.zeros(4, 8, dtype=torch.int32)
    d["num_splits"] = torch.zeros(8, dtype=torch.int32)  # the key is flashmla_num_splits
    with pytest.raises(ValueError, match=r"destinations\[0\]: unknown keys \['num_splits'\]"):
        pydsa.MetadataCopy([d])


@pytest.mark.parametrize("page_size", [3, 0, 2048, 2.0, True])
def test_kv_cache_checks_its_page_size_when_made(page_size):
    with pytest.raises(ValueError, match="page_size must be a power of two"):
        pydsa.KVCache(torch.zeros(1728 * 4, dtype=torch.uint8), torch.ones(512), torch.zeros(4, 64),
                      page_size=page_size)


def test_kv_cache_checks_eps_when_made():
    with pytest.raises(ValueError, match="eps must be a finite number"):
        pydsa.KVCache(torch.zeros(1728 * 4, dtype=torch.uint8), torch.ones(512), torch.zeros(4, 64), page_size=2,
                      eps=-1.0)


def test_sglang_decode_plan_names_what_was_passed():
    with pytest.raises(RuntimeError, match=r"seq_lens must be a torch.Tensor \(got numpy.ndarray\)"):
        S.CompressorDecodePlan.generate_online(np.arange(4), torch.arange(4), R2T)
    with pytest.raises(RuntimeError, match="one length .got 4 and 3"):
        S.CompressorDecodePlan.generate_online(torch.arange(4), torch.arange(3), R2T)
    with pytest.raises(RuntimeError, match=r"seq_lens must be a contiguous 1-D int64 tensor \(got int32 \[4\]"):
        S.CompressorDecodePlan.generate_online(torch.arange(4, dtype=torch.int32), torch.arange(4), R2T)


@pytest.mark.parametrize("bad", [-1, 2**31, 2**32 + 5])
def test_sglang_decode_plan_refuses_a_seq_len_its_record_would_wrap(bad):
    with pytest.raises(RuntimeError, match=r"seq_lens must lie in 0..2\^31-1"):
        S.CompressorDecodePlan.generate_online(torch.tensor([5, bad, 7]), torch.arange(3), R2T)


def test_the_library_pads_and_counts_a_seq_len_its_record_would_wrap():
    """Device tensors are not read on the host: the plan kernel writes a padding record and counts it
    (the same code runs on the host backend, exercised here through the filler)."""
    seq = torch.tensor([5, -1, 2**33, 128])
    plan = torch.full((4, 16), 0xAB, dtype=torch.uint8)
    pydsa.error_count("cpu")
    pydsa.reset_error_count("cpu")
    assert _fill_records.decode_records(seq, torch.arange(4), state_slot_offset=0, plan_d=plan,
                                        flags=DEFAULT_PDL_FLAG) == 0
    assert plan.view(torch.int32)[:, 0].tolist() == [5, 0, 0, 128]
    assert pydsa.error_count("cpu") == 2


def test_sglang_prefill_plan_names_a_length_mismatch_as_one():
    with pytest.raises(RuntimeError, match="req_pool_indices has 3 entries but seq_lens has 2"):
        S.CompressorPrefillPlan.generate_online(torch.tensor([300, 200]), torch.tensor([100, 50]), torch.arange(3),
                                                R2T, 150)
    with pytest.raises(ValueError, match="extend_lens has 3 entries but seq_lens has 2"):
        S.CompressorPrefillPlan.generate_online(torch.tensor([300, 200]), torch.tensor([100, 50, 7]), torch.arange(2),
                                                R2T, 157)


def _decode_plan():
    return S.CompressorDecodePlan.generate_online(torch.tensor([5, 128, 7]), torch.arange(3), R2T)


@pytest.mark.parametrize("which, value, says", [
    ("ape", torch.randn(128, 256), r"ape must be \[128, 512\] \(got float32 \[128, 256\]"),
    ("kv_score_input", torch.randn(3, 1000), r"kv_score_input must have shape \[3, 1024\] \(got \[3, 1000\]\)"),
    ("kv_score_input", torch.randn(3, 1024).double(), "kv_score_input must have dtype torch.float32"),
    ("kv_score_input", np.zeros((3, 1024), np.float32), r"kv_score_input must be a torch.Tensor \(got numpy.ndarray\)"),
    ("kv_score_buffer", torch.zeros(4, 1000), r"kv_score_buffer must be \[num_slots, 1536\].*\[4, 1000\]"),
    ("out", torch.zeros(2, 512), r"out must have shape \[3, 512\]"),
])
def test_compress_forward_errors_are_in_sglang_s_words(which, value, says):
    args = dict(kv_score_buffer=torch.zeros(4, 1536), kv_score_input=torch.randn(3, 1024), ape=torch.randn(128, 512))
    kwargs = {}
    if which == "out":
        kwargs["out"] = value
    else:
        args[which] = value
    with pytest.raises((TypeError, ValueError), match=says):
        S.compress_forward(*args.values(), _decode_plan(), head_dim=512, compress_ratio=128, is_online=True, **kwargs)


def test_compress_norm_rope_store_errors_are_in_sglang_s_words():
    plan = _decode_plan()
    kv = torch.randn(3, 512)
    freq = torch.polar(torch.ones(300, 32), torch.zeros(300, 32))
    with pytest.raises(TypeError, match="out_loc must have dtype torch.int64"):
        S.compress_norm_rope_store(kv, plan, norm_weight=torch.ones(512), norm_eps=1e-6, freq_cis=freq,
                                   out_loc=torch.arange(3, dtype=torch.int32),
                                   kvcache=torch.zeros(3, 1728, dtype=torch.uint8), page_size=2)
    with pytest.raises(ValueError, match="kvcache holds 1000 bytes; .* whole 1728-byte pages"):
        S.compress_norm_rope_store(kv, plan, norm_weight=torch.ones(512), norm_eps=1e-6, freq_cis=freq,
                                   out_loc=torch.arange(3), kvcache=torch.zeros(1000, dtype=torch.uint8), page_size=2)


# The namesakes: the package index's `pydsa` (a DSA signature library) and `pyplan` (a capital-planning tool whose
# package imports pandas) install packages of this project's import names. Each case below lays out an install in
# a temporary folder and runs Python on it alone (-S: no site-packages, so no editable install's finder).
SRC = os.path.dirname(os.path.dirname(os.path.abspath(pydsa.__file__)))
WHEEL = "/tmp/wheelhouse/dsa_kernels-0.1.0-cp311-cp311-manylinux_2_34_x86_64.whl"


def _dist_info(site, name, version, files, direct_url=None):
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text("".join(f"{f},,\n" for f in files))
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url))


def _sources(folder):
    """This project's pydsa and pyplan sources in `folder` (no compiled modules: every case fails before them)."""
    for package in ("pydsa", "pyplan"):
        shutil.copytree(os.path.join(SRC, package), folder / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.c", "*.cpp"))


def _wheel_install(tmp_path):
    """site-packages after `pip install <the dsa_kernels wheel>`."""
    site = tmp_path / "site"
    _sources(site)
    _dist_info(site, "dsa-kernels", "0.1.0", ["pydsa/__init__.py", "pyplan/__init__.py"],
               {"archive_info": {}, "url": "file://" + WHEEL})
    return site


def _pypi_pyplan(site):
    """`pip install --no-deps pyplan` (the index's): its package's files, over this project's where they meet."""
    (site / "pyplan").mkdir(parents=True, exist_ok=True)
    (site / "pyplan" / "__init__.py").write_text("from .core import *\n")
    (site / "pyplan" / "core.py").write_text("import pandas as pd\n")
    _dist_info(site, "pyplan", "0.0.1", ["pyplan/__init__.py", "pyplan/core.py"])


def _python(args, path, cwd):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in path)
    return subprocess.run([sys.executable, "-S", *args], cwd=cwd, env=env, capture_output=True, text=True)


ENTRIES = {"import": ["-c", "import pydsa"], "info": ["-m", "pydsa", "info"], "demo": ["-m", "pydsa", "demo"]}


@pytest.mark.parametrize("entry", ENTRIES)
def test_pypi_s_pyplan_over_a_wheel_install_is_named_with_a_repair_from_the_wheel(tmp_path, entry):
    """Its __init__ imports pandas: before the check, every entry said the compiled modules were missing
    (No module named 'pandas') and suggested a reinstall from an index dsa-kernels is not on."""
    site = _wheel_install(tmp_path)
    _pypi_pyplan(site)
    r = _python(ENTRIES[entry], [site], tmp_path)
    said = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 1 and said.startswith("ImportError: pydsa: the `pyplan` that Python imports"), r.stderr
    assert (f"({site / 'pyplan' / '__init__.py'}) is not this project's but the distribution pyplan 0.0.1, the "
            f"package index's pyplan: a capital-planning tool, unrelated to this project") in said
    assert "built from its clone (it is on no package index, whose pydsa and pyplan are unrelated projects)" in said
    assert said.endswith(f"repair: `pip uninstall -y pyplan && pip install --force-reinstall --no-deps {WHEEL}`")
    assert "pandas" not in r.stderr and "compiled modules" not in r.stderr


def test_a_pyplan_earlier_on_the_path_than_a_clone_is_named_with_a_repair_in_the_clone(tmp_path):
    clone, elsewhere = tmp_path / "clone", tmp_path / "elsewhere"
    _sources(clone)
    (clone / "pyproject.toml").write_text("[project]\nname = 'dsa-kernels'\n")
    _pypi_pyplan(elsewhere)
    r = _python(ENTRIES["import"], [elsewhere, clone], tmp_path)
    said = r.stderr.strip().splitlines()[-1]
    assert "is not this project's but the distribution pyplan 0.0.1" in said, r.stderr
    assert said.endswith(f"repair, in the clone {clone}: `pip uninstall -y pyplan && pip install --no-build-isolation "
                         f"-e .` (or `bash setup.sh`)")
    r = _python(ENTRIES["import"], [clone, elsewhere], tmp_path)  # the clone first: its own pyplan
    assert "not this project's" not in r.stderr, r.stderr


def test_a_pyplan_outside_any_distribution_is_named_with_its_folder(tmp_path):
    site, elsewhere = _wheel_install(tmp_path), tmp_path / "elsewhere"
    (elsewhere / "pyplan").mkdir(parents=True)
    (elsewhere / "pyplan" / "__init__.py").write_text("import pandas\n")
    said = _python(ENTRIES["import"], [elsewhere, site], tmp_path).stderr.strip().splitlines()[-1]
    assert "is not this project's but a package outside any installed distribution" in said
    assert f"repair: take {elsewhere} off sys.path" in said and "pandas" not in said


def test_pyplan_s_init_removed_by_uninstalling_the_namesake_is_named(tmp_path):
    """`pip uninstall pyplan` after the namesake went over a wheel install removes the __init__.py they shared."""
    site = _wheel_install(tmp_path)
    (site / "pyplan" / "__init__.py").unlink()
    said = _python(ENTRIES["import"], [site], tmp_path).stderr.strip().splitlines()[-1]
    assert f"pyplan/__init__.py is missing (the package folders Python finds: {site / 'pyplan'}" in said
    assert said.endswith(f"repair: `pip install --force-reinstall --no-deps {WHEEL}`")


@pytest.mark.parametrize("command", ["info", "demo"])
def test_pypi_s_pydsa_over_a_wheel_install_is_named_by_the_command_line(tmp_path, command):
    """Its __init__.py (a docstring) replaces this one's: `import pydsa` is theirs and says nothing, but
    python -m pydsa still runs this project's __main__, which names it instead of running the command."""
    site = _wheel_install(tmp_path)
    (site / "pydsa" / "__init__.py").write_text('"""\nDSA Signature Algorithm\n"""\nimport os\nimport random\n')
    (site / "pydsa" / "dsa.py").write_text("")
    _dist_info(site, "pydsa", "0.14", ["pydsa/__init__.py", "pydsa/dsa.py"])
    r = _python(ENTRIES[command], [site], tmp_path)
    assert r.returncode == 1 and r.stdout == "", r.stdout + r.stderr
    said = r.stderr.strip()
    assert said.startswith(f"pydsa: the `pydsa` that Python imports ({site / 'pydsa' / '__init__.py'}) is not this "
                           f"project's but the distribution pydsa 0.14, the package index's pydsa: a DSA signature "
                           f"library, unrelated to this project"), said
    assert said.endswith(f"repair: `pip uninstall -y pydsa && pip install --force-reinstall --no-deps {WHEEL}`")


@pytest.mark.parametrize("url, says", [
    ({"dir_info": {"editable": True}, "url": "file:///src/pydsa%20clone"},
     "repair, in the clone /src/pydsa clone: `pip uninstall -y pyplan && pip install --no-build-isolation -e .` "
     "(or `bash setup.sh`)"),
    ({"archive_info": {}, "url": "file://" + WHEEL},
     f"repair: `pip uninstall -y pyplan && pip install --force-reinstall --no-deps {WHEEL}`"),
    ({"dir_info": {}, "url": "file:///src/clone"},
     "repair: `pip uninstall -y pyplan && pip install --force-reinstall --no-deps --no-build-isolation /src/clone`"),
    (None, "repair: `pip uninstall -y pyplan`, then reinstall dsa-kernels from its clone (`pip install "
           "--no-build-isolation -e .` or `bash setup.sh` there) or from its wheel file (`pip install "
           "--force-reinstall --no-deps <the dsa_kernels wheel>`)"),
])
def test_the_repair_works_from_where_the_project_was_installed(tmp_path, url, says):
    """Never `pip install dsa-kernels` from an index: the distribution is built from the clone."""
    import importlib.metadata as md
    from pydsa.info import repair
    _dist_info(tmp_path, "dsa-kernels", "0.1.0", [], url)
    assert repair("pyplan", md.PathDistribution(tmp_path / "dsa_kernels-0.1.0.dist-info")) == says


def test_the_tests_run_from_a_clone_that_shadows_an_install_stop_with_one_message(tmp_path):
    """A clone's sources without compiled modules, first on sys.path, before an installed pydsa (as after a
    wheel install, `python -m pytest` in the clone): one message saying where to run them, no tracebacks."""
    import importlib.metadata as md
    installed = [str(f.locate().parent.parent) for f in md.distribution("dsa-kernels").files or ()
                 if f.parts[0] == "pydsa" and f.name.startswith("_read.")]
    if not installed:
        pytest.skip("pydsa is not installed (imported from a source tree)")
    clone = tmp_path / "clone"
    _sources(clone)
    (clone / "pyproject.toml").write_text("[project]\nname = 'dsa-kernels'\n")
    (clone / "tests").mkdir()
    shutil.copy(os.path.join(os.path.dirname(__file__), "conftest.py"), clone / "tests")
    (clone / "tests" / "test_one.py").write_text("import pydsa\n\n\ndef test_one():\n    assert pydsa\n")
    r = _python(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], [clone, *installed], clone)
    out = r.stdout + r.stderr
    assert r.returncode == 4 and "Traceback" not in out and "circular import" not in out and "error" not in out, out
    assert out.count("cd /tmp && python -m pytest -q " + str(clone / "tests")) == 1, out


def test_info_notes_a_namesake_installed_beside_this_project(tmp_path, monkeypatch, capsys):
    """Installed but not imported (an editable install's finder comes first): info says it is there."""
    from pydsa import info
    _dist_info(tmp_path, "pyplan", "0.0.1", ["pyplan/core.py", "pyplan/helpers.py"])
    monkeypatch.syspath_prepend(str(tmp_path))
    assert info.main([]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("pydsa info: note:")]
    assert notes == ["pydsa info: note: the distribution pyplan 0.0.1 (the package index's pyplan: a capital-planning "
                     "tool, unrelated to this project) is installed too; Python imports this project's pyplan here, "
                     "but a wheel install would share files with it: `pip uninstall -y pyplan` unless you need it"]
