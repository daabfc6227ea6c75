"""Careless inputs meet a named error, never a silent acceptance or an internal exception."""
from __future__ import annotations

import pathlib
import subprocess

import numpy as np
import pytest
import torch

import pydsa
from pydsa import sglang

D = 512


def _decode_args():
    return (torch.zeros(8, 1, 3 * D), torch.randn(1, 2 * D), torch.zeros(1, D), torch.randn(128, D),
            torch.zeros(1, dtype=torch.int32), torch.ones(1, dtype=torch.int32))


def test_a_pdl_flag_that_is_not_a_bool_is_refused():
    with pytest.raises(TypeError, match="pdl must be True, False or None"):
        pydsa.c128_decode(*_decode_args(), pdl="yes")


def test_a_stream_that_is_not_a_handle_is_refused_by_name():
    with pytest.raises(TypeError, match="stream must be a raw cudaStream_t handle"):
        pydsa.c128_decode(*_decode_args(), stream=object())


def test_helpers_refuse_what_the_ops_refuse():
    with pytest.raises(ValueError, match="page_size must be a power of two"):
        pydsa.kv_page_bytes(512, 3)
    with pytest.raises(ValueError, match="batch_size must be an int >= 0"):
        pydsa.bank_bytes(-1, 8)
    with pytest.raises(ValueError, match="state_dtype_bytes must be 4"):
        pydsa.bank_bytes(4, 8, 512, 3)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has a GPU")
def test_a_device_ordinal_without_a_gpu_is_a_named_error():
    with pytest.raises(ValueError, match="no CUDA device is available"):
        pydsa.error_count(0)
    with pytest.raises(ValueError, match="device must be 'cpu'"):
        pydsa.error_count("tpu:9")


def test_metadata_copy_sources_must_be_a_dict():
    with pytest.raises(TypeError, match="sources must be a dict"):
        pydsa.metadata_copy([1, 2, 3], {})


def test_sglang_mtp_calls_check_rows_against_batch_size():
    state = torch.zeros(64, 3 * D)
    one = torch.zeros(1, dtype=torch.int64)
    with pytest.raises(ValueError, match="kv_score_input has 1 rows but the call reads 2"):
        sglang.online_c128_mtp_write_prefix_states(torch.randn(1, 2 * D), one, one, None, torch.randn(128, D), state,
                                                   1, 2, 8)
    with pytest.raises(ValueError, match="seq_lens has 1 rows but the call reads 5"):
        sglang.online_c128_mtp_commit_pending(one, one, None, torch.full((8,), -1), state, 5, 2, 8, 8)
    with pytest.raises(TypeError, match="seq_lens must be a torch.Tensor"):
        sglang.online_c128_mtp_commit_pending(np.zeros(5, np.int64), one, None, torch.full((8,), -1), state, 1, 2, 8, 8)


def test_a_prefill_plan_for_fewer_requests_than_indices_is_refused():
    """A plan made for the first 3 of 4 requests used to run with error count 0, request 3 never written."""
    import pyplan
    seq, ext = np.array([5, 9, 130, 7]), np.array([5, 9, 130, 7])
    plan = pyplan.plan_prefill(seq[:3], ext[:3], num_tokens=int(ext.sum()), graph=True)
    state = torch.zeros(8, 1, 3 * D)
    kv = torch.randn(int(ext.sum()), 2 * D)
    with pytest.raises(pydsa.DsaError, match="the plan's records cover 3 requests but batch_size"):
        pydsa.c128_prefill(state, kv, torch.zeros(int(ext.sum()), D), torch.randn(128, D),
                           torch.arange(4, dtype=torch.int32), plan)


def _fake_dist(tmp_path, name, files):
    """An installed distribution in tmp_path whose RECORD lists `files` {path: (content on disk, content recorded)}."""
    import base64
    import hashlib
    import importlib.metadata as md
    info = tmp_path / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    rows = []
    for path, (on_disk, recorded) in files.items():
        target = tmp_path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if on_disk is not None:
            target.write_bytes(on_disk)
        digest = base64.urlsafe_b64encode(hashlib.sha256(recorded).digest()).rstrip(b"=").decode()
        rows.append(f"{path},sha256={digest},{len(recorded)}")
    (info / "RECORD").write_text("\n".join(rows) + "\n")
    return md.PathDistribution(info)


def test_info_names_a_file_another_package_replaced_and_the_namesake_that_claims_it(tmp_path):
    from pydsa.info import replaced_files
    ours = _fake_dist(tmp_path, "dsa-kernels", {"pydsa/__init__.py": (b"theirs", b"ours"),
                                                "pyplan/__init__.py": (b"same", b"same")})
    namesake = _fake_dist(tmp_path, "pydsa", {"pydsa/__init__.py": (b"theirs", b"theirs")})
    problems = replaced_files(ours, [ours, namesake])
    assert any("pydsa/__init__.py is not dsa-kernels' file" in p for p in problems)
    assert any("the distribution pydsa 1.0 (a DSA signature library) also installs pydsa/__init__.py" in p
               and "pip uninstall -y pydsa" in p for p in problems)
    assert replaced_files(ours, [ours]) != [] and not any("pyplan" in p for p in problems)


def test_a_source_tree_shadowing_the_installed_package_is_named(tmp_path):
    """Running from a checkout whose pydsa/ has no compiled modules, with pydsa installed elsewhere: the
    ImportError says the source tree shadows the installed package and how to fix it."""
    import glob
    import os
    import shutil
    import subprocess
    import sys
    src = os.path.dirname(pydsa.__file__)
    if not glob.glob(os.path.join(src, "_read*.so")):
        pytest.skip("an editable install: its finder resolves pydsa to the clone wherever Python runs")
    tree = tmp_path / "checkout"
    shutil.copytree(src, tree / "pydsa", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    (tree / "pyproject.toml").write_text("[project]\nname = 'dsa-kernels'\n")
    r = subprocess.run([sys.executable, "-c", "import pydsa"], cwd=tree, capture_output=True, text=True)
    assert r.returncode != 0 and "shadows the installed package" in r.stderr, r.stderr[-2000:]


def test_round_between_drafts_is_a_bf16_flag():
    state = torch.zeros(16, 1, 3 * D)
    args = (state, torch.randn(2, 2 * D), None, torch.randn(128, D), torch.zeros(1, dtype=torch.int32),
            torch.ones(1, dtype=torch.int32), torch.full((1,), 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="round_between_drafts=False applies to a bf16 state only"):
        pydsa.c128_verify(*args, round_between_drafts=False)
    with pytest.raises(TypeError, match="round_between_drafts must be a bool"):
        pydsa.c128_verify(*args, round_between_drafts="no")
    pydsa.c128_verify(state.to(torch.bfloat16), *args[1:], round_between_drafts=False)


def test_more_helpers_and_sglang_arguments_are_judged_by_name():
    import pyplan
    from pydsa.sglang import compress as sglang_v2
    with pytest.raises(ValueError, match="max_tokens must be an int in 1"):
        pydsa.DevicePlan(10 ** 15, 4, device="cpu")
    with pytest.raises(pydsa.ArgumentTypeError, match="out\\[0\\] must be a buffer of records"):
        pyplan.plan_prefill(np.array([5]), np.array([5]), out=(np.zeros(8), np.zeros(8)))
    plan = sglang_v2.CompressorDecodePlan(128, torch.zeros(1, 16, dtype=torch.uint8))
    with pytest.raises(TypeError, match="norm_eps must be a float"):
        sglang_v2.compress_norm_rope_store(torch.zeros(1, 512), plan, norm_weight=torch.ones(512), norm_eps=None,
                                           freq_cis=torch.zeros(8, 64), out_loc=torch.zeros(1, dtype=torch.int64),
                                           kvcache=torch.zeros(1728, dtype=torch.uint8), page_size=2)


def test_an_out_that_aliases_kv_score_is_refused():
    kv = torch.randn(2, 2 * D)
    with pytest.raises(ValueError, match="out shares memory with kv_score"):
        pydsa.c128_decode(torch.zeros(8, 1, 3 * D), kv, kv.view(-1)[D:3 * D].view(2, D), torch.randn(128, D),
                          torch.zeros(2, dtype=torch.int32), torch.ones(2, dtype=torch.int32))


def test_kv_cache_judges_each_argument_by_name_and_takes_a_dlpack_cache():
    w = torch.ones(D)
    rot = torch.zeros(16, 64)
    with pytest.raises(ValueError, match="the D comes from norm_weight's 256 channels"):
        pydsa.KVCache(torch.zeros(4, pydsa.kv_page_bytes(D, 2), dtype=torch.uint8), torch.ones(256), rot, page_size=2)
    with pytest.raises(ValueError, match="cache must be contiguous"):
        pydsa.KVCache(torch.zeros(4, 2 * pydsa.kv_page_bytes(D, 2), dtype=torch.uint8)[:, ::2], w, rot, page_size=2)
    cache = pydsa.KVCache(np.zeros((4, pydsa.kv_page_bytes(D, 2)), np.uint8), w, rot, page_size=2)
    assert cache.num_pages == 4


def test_sglang_planners_take_numpy_and_refuse_a_token_count_the_extends_do_not_sum_to():
    rpi, r2t = torch.arange(2), torch.zeros(2, 64, dtype=torch.int32)
    c, w = np.zeros((11, 16), np.uint8), np.zeros((11, 16), np.uint8)
    assert sglang.plan_compress_online_prefill(np.array([5, 6]), np.array([5, 6]), c, w, False) == (0, 2)
    with pytest.raises(RuntimeError, match="extend_lens must have dtype int64 \\(got numpy int32\\)"):
        sglang.plan_compress_online_prefill(np.array([5, 6], np.int32), np.array([5, 6]), c, w, False)
    with pytest.raises(ValueError, match="compress_plan must be a uint8 \\[M, 16\\] array.*got numpy float64"):
        sglang.plan_compress_online_prefill(np.array([5, 6]), np.array([5, 6]), np.zeros((11, 16)), w, False)
    with pytest.raises(RuntimeError, match="num_q_tokens is 20 but the extends sum to 11"):
        sglang.CompressorPrefillPlan.generate_online(torch.tensor([5, 6]), torch.tensor([5, 6]), rpi, r2t, 20)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has a GPU")
def test_bench_host_on_a_cpu_says_no_row_ran():
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "pydsa", "bench", "host"], capture_output=True, text=True, timeout=300)
    assert "no CUDA GPU: the host rows need one and did not run; no row ran" in r.stdout, r.stdout + r.stderr


def _sanitizer_summary(tmp_path, logs: dict[str, str]):
    """tests/sanitize.sh's summary (SANITIZE_SKIP_RUN=1) over the given test_x.<tool>.log texts."""
    folder = tmp_path / "logs"
    folder.mkdir()
    for name, text in logs.items():
        (folder / name).write_text(text)
    script = pathlib.Path(__file__).with_name("sanitize.sh")
    env = {"PATH": "/usr/bin:/bin", "SANITIZE_SKIP_RUN": "1", "SANITIZE_MODULES": "test_x",
           "SANITIZE_TOOLS": "racecheck", "SANITIZE_LOGS": str(folder)}
    run = subprocess.run(["bash", str(script), str(tmp_path / "summary.txt")], env=env, capture_output=True,
                         text=True, cwd=tmp_path)
    return run.returncode, (tmp_path / "summary.txt").read_text()


@pytest.mark.parametrize("log, verdict, rc", [
    ("========= COMPUTE-SANITIZER\n3 passed in 1.0s\n========= RACECHECK SUMMARY: 0 hazards displayed\n", "ok", 0),
    ("========= COMPUTE-SANITIZER\n3 passed in 1.0s\n========= RACECHECK SUMMARY: 2 hazards displayed\n", "FAIL", 1),
    # stopped after its tests passed, before the tool's summary: not reported clean
    ("========= COMPUTE-SANITIZER\n3 passed in 1.0s\n", "INCOMPLETE", 1),
    # stopped with a finding already printed, or before its tests ended
    ("========= COMPUTE-SANITIZER\n========= Race reported between Write access\n3 passed in 1.0s\n", "FAIL", 1),
    ("========= COMPUTE-SANITIZER\n..\n", "FAIL", 1),
])
def test_a_sanitizer_run_is_clean_only_when_the_tool_said_so(tmp_path, log, verdict, rc):
    code, summary = _sanitizer_summary(tmp_path, {"test_x.racecheck.log": log})
    assert f"test_x racecheck: {verdict};" in summary, summary
    assert code == rc
