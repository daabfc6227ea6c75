"""`python -m pydsa soak`: requests keep arriving and finishing for every step, each step busy, every
closed chunk and every c4 entry checked against float64 and the caches against their mirrors where the
ops ran; a run with one thing broken on purpose must fail, naming what broke; the memory judgement fails
a leak and passes the allocators' noise."""
import json

import numpy as np
import pytest

import pydsa
from pydsa import _soak_memory, _soak_report, soak
from pydsa.__main__ import main as cli


def test_soak_keeps_every_step_busy_and_checks_every_op(device):
    r = soak.run(160, device, seed=3, checkpoint=40, progress=False, pool_rows=4096)
    assert r["ok"], r
    assert r["busy_steps"] == r["steps"] == 160
    assert [c["step"] for c in r["checkpoints"]] == [40, 80, 120, 160]
    # every op ran, slots were reused, drafts were both accepted and rejected
    assert r["prefill_launches"] > 0 and r["decode_steps"] > 0 and r["verify_steps"] > 0
    assert r["requests_finished"] > 0 and r["requests_arrived"] > soak.MAX_RUNNING
    assert r["drafts_accepted"] > 0 and r["drafts_rejected"] > 0
    assert r["chunks_checked"] > 100 and r["cache_entries_stored"] >= r["chunks_checked"]
    assert 0 < r["max_relative_error"] < soak.TOLERANCE
    assert r["chunk_failures"] == r["cache_mismatches"] == r["index_errors"] == 0
    # the c4 layer served its own requests with every call, both compressors checked, both caches compared
    assert r["c4_steps"] == 160 // r["c4_every"] and r["c4_requests_arrived"] > 1
    assert r["c4_extends"] > 0 and r["c4_decodes"] > 0 and r["c4_verifies"] > 0
    assert r["c4_drafts_accepted"] > 0 and r["c4_drafts_rejected"] > 0
    assert r["c4_entries_checked"] > 1000 and r["c4_entries_stored"] >= r["c4_entries_checked"]
    assert 0 < r["c4_max_relative_error"] < soak.TOLERANCE
    assert r["c4_failures"] == r["c4_cache_mismatches"] == 0
    assert r["memory_flat"] and all(r["memory"][m]["ok"] for m in _soak_memory.MEASURES)


@pytest.mark.parametrize("fault, counter", [("out", "chunk_failures"), ("leak", "chunk_failures"),
                                            ("cache", "cache_mismatches"), ("c4ring", "c4_failures"),
                                            ("c4cache", "c4_cache_mismatches")])
def test_a_broken_result_fails_the_soak(device, fault, counter):
    r = soak.run(120, device, seed=5, checkpoint=60, fault=fault, progress=False, pool_rows=4096)
    assert not r["ok"]
    assert r[counter] > 0, r


def test_a_planted_leak_fails_the_soak_on_the_memory_line_that_saw_it(device):
    """fault="retain" keeps one request's raw rows (4 MiB) every 50 steps and breaks nothing else: every
    counter stays 0, and the memory that holds them (the device's on a GPU, the host heap on the host
    backend) is judged growing."""
    r = soak.run(200, device, seed=2, checkpoint=50, fault="retain", progress=False, pool_rows=4096)
    assert r["chunk_failures"] == r["cache_mismatches"] == r["index_errors"] == 0
    assert r["c4_failures"] == r["c4_cache_mismatches"] == 0
    seen = "device" if r["device"].startswith("cuda") else "heap"
    assert not r["ok"] and not r["memory_flat"] and not r["memory"][seen]["ok"], r["memory"]
    assert r["memory"][seen]["growth_mb"] >= 4.0
    line = next(x for x in _soak_report.memory_lines(r["memory"]).splitlines()
                if x.startswith("device memory" if seen == "device" else "host heap"))
    assert "GROWING" in line


def _jitter(rng, n, mb):
    return rng.normal(0.0, mb, n)


@pytest.mark.parametrize("seed", range(20))
def test_the_memory_judgement_passes_allocator_noise(seed):
    """Jitter, transient peaks of up to 200 MB (a check's temporaries), a one-off rise that stays (pages
    taken once and kept) early in the judged span, and memory given back anywhere: not growth."""
    rng = np.random.default_rng(seed)
    n = 150
    y = 600.0 + _jitter(rng, n, 0.05)
    y[rng.integers(0, n, 12)] += rng.uniform(20.0, 200.0, 12)
    y[int(rng.integers(1, n // 3 - 3)):] += rng.uniform(10.0, 120.0)
    y[int(rng.integers(1, n)):] -= rng.uniform(0.0, 100.0)
    assert _soak_memory.growth(y, 1.0)["ok"]
    assert _soak_memory.growth(np.full(n, 3.5), 0.0, exact=True)["ok"]


@pytest.mark.parametrize("seed", range(20))
def test_the_memory_judgement_fails_a_leak(seed):
    """One request's state (4 MB) kept every 50 steps, sampled each step, in a 200-step run (150 steps judged),
    under the same noise; or leaked a little every step; or once by 0.5 MB on an exact measure."""
    rng = np.random.default_rng(seed)
    n = 150
    noise = _jitter(rng, n, 0.05)
    noise[rng.integers(0, n, 6)] += rng.uniform(20.0, 200.0, 6)
    phase = int(rng.integers(0, 50))
    staircase = 600.0 + 4.0 * ((np.arange(n) + phase) // 50) + noise
    assert not _soak_memory.growth(staircase, 1.0)["ok"]
    assert _soak_memory.growth(staircase, 1.0)["growth_mb"] >= 4.0 - 0.5
    assert not _soak_memory.growth(600.0 + 0.1 * np.arange(n) + noise, 1.0)["ok"]
    exact = np.full(n, 3.5)
    exact[int(rng.integers(1, n)):] += 0.5
    assert not _soak_memory.growth(exact, 0.0, exact=True)["ok"]


def test_the_memory_trace_is_bounded_and_samples_the_end():
    import torch
    for steps in (1, 7, 255, 256, 1000, 100_003):
        trace = _soak_memory.MemoryTrace(steps, torch.device("cpu"))
        for step in range(steps):
            trace.sample(step)
        steps_sampled = trace.rows[:trace.n, 0]
        assert trace.n <= _soak_memory.SAMPLES + 1 and steps_sampled[-1] == steps
        assert np.all(np.diff(steps_sampled) > 0)


@pytest.mark.parametrize("kwargs, name", [(dict(steps=0), "steps"), (dict(steps=True), "steps"),
                                          (dict(steps=2.0), "steps"), (dict(checkpoint=0), "checkpoint"),
                                          (dict(fault="nan"), "fault")])
def test_soak_refuses_bad_arguments_by_name(kwargs, name):
    args = dict(steps=10, device="cpu", progress=False)
    args.update(kwargs)
    with pytest.raises(pydsa.ArgumentError, match=name) as e:
        soak.run(**args)
    assert e.value.argument == name


def test_soak_command_line(tmp_path, capsys):
    out = tmp_path / "soak.json"
    assert cli(["soak", "--steps", "30", "--checkpoint", "10", "--device", "cpu", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["steps"] == r["busy_steps"] == 30 and r["ok"] is True and len(r["checkpoints"]) == 3
    assert r["c4_entries_checked"] > 0 and r["c4_failures"] == 0 and r["memory"]["heap"]["ok"] is True
    assert r["command"].endswith("--steps 30 --checkpoint 10 --device cpu --json " + str(out)) and r["date"]
    printed = capsys.readouterr().out
    assert "PASS" in printed and "run and checked on the host backend" in printed
    assert "checked on the device" not in printed
    for bad in (["--steps", "0"], ["--checkpoint", "0"], ["--seed", "-1"], ["--device", "tpu"]):
        with pytest.raises(SystemExit) as e:
            cli(["soak", *bad])
        assert e.value.code == 2
        assert bad[0] in capsys.readouterr().err


def test_soak_help_is_whole(capsys):
    with pytest.raises(SystemExit) as e:
        cli(["soak", "--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    description = text[text.index("The c128 serving loop"):text.index("options:")].strip()
    assert description.endswith(".") and "judged for growth" in description
    assert "Exit status 0" in text and text.endswith(".")


def test_the_default_config_soaks_the_offline_compressor(device):
    """--config default: the c128 layer is the offline compressor; every step busy, every op ran, every chunk and
    the cache checked; a broken output fails it; a leak (which needs a commit) is refused naming the fault."""
    r = soak.run(80, device, seed=4, checkpoint=40, progress=False, pool_rows=4096, config="default")
    assert r["ok"] and r["config"] == "default" and r["busy_steps"] == 80, r
    assert r["prefill_launches"] > 0 and r["decode_steps"] > 0 and r["verify_steps"] > 0 and r["drafts_rejected"] > 0
    assert r["chunks_checked"] > 50 and r["cache_entries_stored"] >= r["chunks_checked"]
    assert r["chunk_failures"] == r["cache_mismatches"] == r["index_errors"] == 0
    bad = soak.run(60, device, seed=5, checkpoint=30, fault="out", progress=False, pool_rows=4096, config="default")
    assert not bad["ok"] and bad["chunk_failures"] > 0
    with pytest.raises(pydsa.ArgumentError, match="leak") as e:
        soak.run(10, device, fault="leak", progress=False, config="default")
    assert e.value.argument == "fault"
    with pytest.raises(pydsa.ArgumentError, match="config"):
        soak.run(10, device, progress=False, config="offline")


def test_soak_command_line_takes_the_config(tmp_path, capsys):
    out = tmp_path / "soak.json"
    assert cli(["soak", "--steps", "20", "--checkpoint", "10", "--device", "cpu", "--config", "default",
                "--json", str(out)]) == 0
    assert json.loads(out.read_text())["config"] == "default"
    assert "offline (sglang's default)" in capsys.readouterr().out
