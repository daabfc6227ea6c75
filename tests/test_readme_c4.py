"""The README's c4 block runs as written: it is the users' first c4 call, so it must not drift from the API."""
from __future__ import annotations

import pathlib
import re

import pytest

from conftest import DEVICES

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _c4_block() -> str:
    text = README.read_text()
    section = text[text.index("## The c4 layers"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.parametrize("device", DEVICES)
def test_the_readme_c4_block_runs_as_written(device):
    code = _c4_block().replace('dev, R, slots_n = "cpu"', f'dev, R, slots_n = "{device}"')
    scope: dict = {}
    exec(compile(code, str(README), "exec"), scope)
    main, indexer = scope["main"], scope["indexer"]
    assert main.ring_size == 16 and main.num_slots == 4
    # every prefill, decode and verify entry was stored: no page of either cache is still all zeros
    for comp in (main, indexer):
        assert comp.store.cache[0].any() and comp.store.cache[1].any()
