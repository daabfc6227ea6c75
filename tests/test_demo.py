"""The demo (the README's first command) and `info` run and check themselves."""
import pytest
import torch

import pydsa
from conftest import DEVICES

from pydsa import demo, info
from pydsa.__main__ import main


def test_demo_passes_on_defaults_briefly(capsys):
    assert main(["demo", "--steps", "25", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "host backend" in out.splitlines()[0] and "PASS" in out


def test_demo_summary_counts_its_checks():
    r = demo.run(steps=30, device="cpu", progress=False)
    assert r["ok"] and r["chunks_emitted"] > 10 and r["verify_steps"] > 0 and r["max_relative_error"] < 1e-5
    assert r["drafts_accepted"] > 0 and r["drafts_rejected"] > 0


def test_a_rejected_draft_leaking_into_a_state_fails_the_demo():
    """Committing every verified draft while only some are accepted corrupts later chunk vectors."""
    r = demo.run(steps=40, device="cpu", leak=True, progress=False)
    assert not r["ok"] and r["chunk_failures"] > 0


def test_a_broken_check_makes_the_demo_fail(monkeypatch):
    """A test double corrupts one element of every emitted vector: the demo must exit 1."""
    original = demo.Checker.__init__

    def corrupting(self, ape, d, corrupt):
        original(self, ape, d, True)

    monkeypatch.setattr(demo.Checker, "__init__", corrupting)
    assert main(["demo", "--steps", "12", "--device", "cpu"]) == 1


def test_info_runs(capsys):
    assert info.main([]) == 0
    out = capsys.readouterr().out
    assert "ABI" in out and "library:" in out


def test_cli_rejects_unknown_commands():
    assert main(["nope"]) == 2
    with pytest.raises(SystemExit):
        main(["bench", "nothing"])


def test_demo_refuses_zero_steps_and_a_missing_gpu():
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "pydsa", "demo", "--steps", "0"], capture_output=True, text=True)
    assert r.returncode == 2 and "--steps and --requests must be at least 1" in r.stderr
    if not torch.cuda.is_available():
        r = subprocess.run([sys.executable, "-m", "pydsa", "demo", "--device", "cuda"], capture_output=True, text=True)
        assert r.returncode == 2 and "no CUDA device is available" in r.stderr, r.stderr
        with pytest.raises(ValueError, match="no CUDA device is available"):
            pydsa.DevicePlan(128, 1)


@pytest.mark.parametrize("device", DEVICES)
def test_tour_runs_as_written(device):
    import os
    import subprocess
    import sys
    tour = os.path.join(os.path.dirname(__file__), "..", "examples", "tour.py")
    r = subprocess.run([sys.executable, tour, "--device", torch.device(device).type], capture_output=True, text=True)
    assert r.returncode == 0 and "tour: OK" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("device", DEVICES)
def test_the_c4_layer_of_the_demo_checks_every_committed_entry(device):
    from pydsa import demo_c4
    r = demo_c4.run(40, 6, torch.device(device), seed=3, progress=False)
    assert r["c4_ok"] and r["c4_entries_checked"] > 100 and r["c4_max_relative_error"] < 1e-5
    assert r["c4_extends"] > 0 and r["c4_decodes"] > 0 and r["c4_verifies"] > 0 and r["c4_drafts_rejected"] > 0


def test_a_c4_entry_that_differs_from_float64_fails_the_demo(monkeypatch):
    """A test double perturbs the float64 reference: the c4 checks must count the failures."""
    from pydsa import demo_c4
    original = demo_c4.entry64
    monkeypatch.setattr(demo_c4, "entry64", lambda rows, ape: original(rows, ape) * 1.001)
    r = demo_c4.run(20, 4, torch.device("cpu"), seed=1, progress=False)
    assert not r["c4_ok"] and r["c4_failures"] == r["c4_entries_checked"] > 0


@pytest.mark.parametrize("fault", ["c4ring", "c4cache"])
def test_a_broken_c4_layer_fails_the_demo(fault):
    """The soak's faults, halfway through: c4ring (every main ring row off by 1, a stale state) makes the entries
    committed after it differ from float64, c4cache flips a byte of a committed main cache entry; the demo's c4
    checks count them, the entries before pass."""
    from pydsa import demo_c4
    r = demo_c4.run(40, 6, torch.device("cpu"), seed=3, progress=False, fault=fault)
    assert not r["c4_ok"] and 0 < r["c4_failures"] < r["c4_entries_checked"]
    if fault == "c4ring":
        assert r["c4_max_relative_error"] > demo_c4.TOLERANCE


def test_soak_keeps_requests_arriving_and_counts_busy_steps():
    """Without --soak a run idles once its requests are served (and says so in busy_steps); with it requests
    keep arriving for every step."""
    idle = demo.run(steps=60, requests=1, device="cpu", progress=False, seed=5)
    soak = demo.run(steps=60, requests=1, device="cpu", progress=False, seed=5, soak=True)
    assert idle["requests_arrived"] == 1 and soak["requests_arrived"] > 1 and soak["ok"]
    assert soak["busy_steps"] == 60 and idle["busy_steps"] <= 60


def test_the_demo_shows_the_c4_layer_s_progress_and_times_the_whole_run(tmp_path, monkeypatch, capsys):
    """The c4 layer runs after the c128 layers' bar is full: it reports its own steps, and the run's time
    includes it (a test double makes it last 0.5 s longer)."""
    import json
    import time
    from pydsa import demo_c4
    original = demo_c4.run

    def slower(*args, **kwargs):
        time.sleep(0.5)
        return original(*args, **kwargs)

    monkeypatch.setattr(demo_c4, "run", slower)
    path = tmp_path / "demo.json"
    assert main(["demo", "--steps", "6", "--device", "cpu", "--json", str(path)]) == 0
    captured = capsys.readouterr()
    assert "c128 layers, step 6/6" in captured.err and "c4 layer, step 6/6" in captured.err
    r = json.loads(path.read_text())
    assert r["wall_s"] >= r["c128_wall_s"] + 0.5
    assert f"in {r['wall_s']:.1f} s (c128 layers {r['c128_wall_s']:.1f} s, c4 layer" in captured.out


def test_the_default_config_runs_the_offline_compressor_and_passes(capsys):
    """--config default (sglang's default: the offline c128 compressor) checks every accepted chunk against float64
    and every cache entry; a leak needs a commit and is refused by name."""
    assert main(["demo", "--steps", "25", "--device", "cpu", "--config", "default"]) == 0
    assert "offline compressor" in capsys.readouterr().out
    r = demo.run(steps=30, device="cpu", progress=False, config="default")
    assert r["ok"] and r["config"] == "default" and r["chunks_emitted"] > 10 and r["max_relative_error"] < 1e-5
    assert r["verify_steps"] > 0 and r["drafts_accepted"] > 0 and r["drafts_rejected"] > 0
    assert r["cache_entries_checked"] > 10 and r["cache_entry_failures"] == 0
    with pytest.raises(pydsa.ArgumentError, match="leak"):
        demo.run(steps=5, device="cpu", progress=False, config="default", leak=True)


def test_a_wrong_offline_output_or_ring_fails_the_default_config(monkeypatch):
    """A test double perturbs what the offline extend writes to out: the float64 checks fail. A ring of 128 rows
    a slot (drafts past a chunk end overwrite the rows a rejection returns to) fails them too."""
    from pydsa import _serving_offline
    original = _serving_offline.c128_offline_extend

    def perturbed(ring, kv, plan, **kw):
        original(ring, kv, plan, **kw)
        kw["out"][:, 0] += 1e-3

    monkeypatch.setattr(_serving_offline, "c128_offline_extend", perturbed)
    r = demo.run(steps=20, device="cpu", progress=False, config="default")
    assert not r["ok"] and r["chunk_failures"] > 0
    monkeypatch.setattr(_serving_offline, "c128_offline_extend", original)
    monkeypatch.setattr(_serving_offline, "SPECULATIVE_RING", 128)
    r = demo.run(steps=60, device="cpu", progress=False, config="default")
    assert not r["ok"] and r["chunk_failures"] > 0
