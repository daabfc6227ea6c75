"""`python -m pydsa soak`: requests keep arriving and finishing for every step, each step busy, every
closed chunk checked against float64 and the cache against its mirror on the device; a run with one
thing broken on purpose must fail, naming what broke."""
import json

import pytest

from pydsa import soak
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


@pytest.mark.parametrize("fault, counter", [("out", "chunk_failures"), ("leak", "chunk_failures"),
                                            ("cache", "cache_mismatches")])
def test_a_broken_result_fails_the_soak(device, fault, counter):
    r = soak.run(120, device, seed=5, checkpoint=60, fault=fault, progress=False, pool_rows=4096)
    assert not r["ok"]
    assert r[counter] > 0, r


@pytest.mark.parametrize("kwargs, name", [(dict(steps=0), "steps"), (dict(steps=True), "steps"),
                                          (dict(checkpoint=0), "checkpoint"), (dict(fault="nan"), "fault")])
def test_soak_refuses_bad_arguments_by_name(kwargs, name):
    args = dict(steps=10, device="cpu", progress=False)
    args.update(kwargs)
    with pytest.raises(ValueError, match=name):
        soak.run(**args)


def test_soak_command_line(tmp_path, capsys):
    out = tmp_path / "soak.json"
    assert cli(["soak", "--steps", "30", "--checkpoint", "10", "--device", "cpu", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["steps"] == r["busy_steps"] == 30 and r["ok"] is True and len(r["checkpoints"]) == 3
    assert r["command"].endswith("--steps 30 --checkpoint 10 --device cpu --json " + str(out)) and r["date"]
    assert "PASS" in capsys.readouterr().out
    for bad in (["--steps", "0"], ["--checkpoint", "0"], ["--seed", "-1"], ["--device", "tpu"]):
        with pytest.raises(SystemExit) as e:
            cli(["soak", *bad])
        assert e.value.code == 2
        assert bad[0] in capsys.readouterr().err
