"""The launch policy (native/src/launch_policy.h): every launch-shape choice of the GPU backend is a pure function
of an op's params and the device's SM count, compiled alone on the host and checked here from a table (no GPU).
Each expected row is derived by hand from the rule the header states."""
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
H200_SMS = 132

# query -> answer. decode: D B bf16 store alignment sms -> vec grid_x grid_y block_x block_y early store_ok fits
DECODE = [
    # one request: 512 / 4 = 128 threads, one tile, one row; 1 block < 3 per SM: dependents early
    ("decode 512 1 0 0 16 132", "4 1 1 128 1 1 1 1"),
    # B = 1024 fp32: 1024 blocks >= 396: dependents late
    ("decode 512 1024 0 0 16 132", "4 1024 1 128 1 0 1 1"),
    # bf16 state, B >= 4096: 8 channels per thread, 64 threads per request, 2 requests per block
    ("decode 512 4096 1 0 16 132", "8 2048 1 64 2 0 1 1"),
    ("decode 512 4095 1 0 16 132", "4 4095 1 128 1 0 1 1"),
    # D = 128: 32 threads per request, 4 requests per block
    ("decode 128 32 0 0 16 132", "4 8 1 32 4 1 1 1"),
    # 8-byte aligned buffers: 2 channels, 256 lanes in two tiles of 128
    ("decode 512 8 0 0 8 132", "2 8 2 128 1 1 1 1"),
    # storing, B = 256 < 3 x 132: 2 channels, all 256 threads of a request in one block
    ("decode 512 256 0 1 16 132", "2 256 1 256 1 1 1 1"),
    # storing, B = 396 = 3 x 132: 4 channels; a storing grid releases early below 9 blocks per SM
    ("decode 512 396 0 1 16 132", "4 396 1 128 1 1 1 1"),
    ("decode 512 1024 0 1 16 132", "4 1024 1 128 1 1 1 1"),
    ("decode 512 1188 0 1 16 132", "4 1188 1 128 1 0 1 1"),
    # ... the plain decode below 3: 396 blocks release late
    ("decode 512 396 0 0 16 132", "4 396 1 128 1 0 1 1"),
    # storing on fewer SMs: B = 256 >= 3 x 66, 4 channels; 256 < 9 x 66: early
    ("decode 512 256 0 1 16 66", "4 256 1 128 1 1 1 1"),
    ("decode 512 600 0 1 16 66", "4 600 1 128 1 0 1 1"),
    # storing with 8-byte alignment at D = 1024: 512 threads per request do not fit a block
    ("decode 1024 10 0 1 8 132", "2 0 0 0 0 0 0 0"),
    # more requests than one launch takes
    ("decode 512 3000000000 0 0 16 132", "4 3000000000 1 128 1 0 1 0"),
]
# verify: D B bf16 store alignment -> vec grid_x grid_y block_x block_y store_ok fits draft_batch
# (drafts a thread loads at a time: 8 with one channel, or two in a storing verify; else 4)
VERIFY = [
    ("verify 512 32 0 0 16", "1 32 4 128 1 1 1 8"),     # B < 128: one channel per thread, 4 tiles
    ("verify 512 256 0 0 16", "2 256 2 128 1 1 1 4"),   # fp32: 2 channels
    ("verify 512 256 1 0 16", "4 256 1 128 1 1 1 4"),   # bf16: 4 channels
    ("verify 512 32 0 1 16", "2 32 1 256 1 1 1 8"),     # storing, small B: 2 channels, the request in one block
    ("verify 512 256 0 1 16", "4 256 1 128 1 1 1 4"),   # storing, large B: 4 channels
    ("verify 1024 32 0 1 8", "2 32 1 512 1 1 1 8"),     # storing D = 1024 at 8 bytes: 512 threads still fit
    ("verify 2048 32 0 1 8", "2 0 0 0 0 0 0 8"),        # ... 1024 do not
]
# copying commit: layers, alignment of the last layer's state (the others 16), bf16 -> channels per thread;
# slot-resolving commit: B -> blocks threads (one request per thread, 128 a block)
COMMIT = [
    ("commit 2 16 0", "4"),   # every layer 16-byte aligned: 4 channels
    ("commit 2 8 0", "2"),    # one fp32 layer 8-byte aligned: 2 for all
    ("commit 2 8 1", "4"),    # bf16: 4 channels are 8 bytes
    ("commit 2 4 1", "2"),
    ("commitslots 1", "1 128"), ("commitslots 128", "1 128"), ("commitslots 129", "2 128"),
    ("commitslots 1024", "8 128"),            # a step of 1024 requests on 8 SMs
    ("commitslots 0", "0 128"),               # (a batch of 0 never launches)
    ("commitslots 2147483647", "16777216 128"),  # the largest batch the check takes
]
# metadata copy: small tiles sms -> large tiles (from 2 x 8 small tiles per SM);
# tiles destinations (0: any count) large sms -> form grid block
COPY = [
    ("copylarge 2111 132", "0"), ("copylarge 2112 132", "1"),
    ("copy 40 2 0 132", "per_destination 80 128"),    # 2 x 40 blocks <= 132 SMs: a block per tile and destination
    ("copy 66 2 0 132", "per_destination 132 128"),
    ("copy 67 2 0 132", "small 67 128"),              # 134 > 132: a block per tile, 67 <= 1.5 per SM
    ("copy 44 3 0 132", "per_destination 132 128"),
    ("copy 40 1 0 132", "small 40 128"),              # one destination: never per destination
    ("copy 40 0 0 132", "small 40 128"),              # a run-time count (more than 3): never per destination
    ("copy 198 1 0 132", "small 198 128"),            # 198 = 1.5 per SM: blocks of 128
    ("copy 199 1 0 132", "narrow 199 64"),            # past 1.5 per SM: narrow blocks
    ("copy 5000 0 0 132", "narrow 2112 64"),          # at most 16 blocks per SM
    ("copy 40 2 1 132", "large 40 128"),              # large tiles: never per destination
    ("copy 3000 1 1 132", "large 2112 128"),
]
# store: D count alignment -> vec grid_x block_x block_y fits
STORE = [
    ("store 512 10 16", "4 10 128 1 1"),
    ("store 512 10 8", "2 10 256 1 1"),
    ("store 128 10 16", "4 3 32 4 1"),
    ("store 512 10 4", "0 0 0 0 0"),
]
# plan upload: records in the launch -> blocks threads (one record per thread, 128 a block; at least one block, whose
# first thread writes the counts); request records: items -> blocks threads (one item per thread, 128 a block, at
# least one block and at most 4096, threads then looping over the items)
PLANS = [
    ("upload 0", "1 128"), ("upload 1", "1 128"), ("upload 128", "1 128"), ("upload 129", "2 128"),
    ("upload 1024", "8 128"),                                  # DSA_UPLOAD_RECORDS, a launch's most
    ("records 0", "1 128"), ("records 1", "1 128"), ("records 128", "1 128"), ("records 129", "2 128"),
    ("records 524288", "4096 128"), ("records 524289", "4096 128"), ("records 3000000000", "4096 128"),
]
# prefill lanes: records D sms -> lanes_log2 (tiny 1, narrow 2, mid 4, wide 5), at-once lanes (-1: does not fit)
LANES = [
    ("lanes 1 512 132", "1 1"),      # 32 narrow items < 66: tiny
    ("lanes 4 512 132", "2 2"),      # 128 narrow items, 32 mid items < 66: narrow
    ("lanes 64 512 132", "4 4"),     # 256 wide items x 2 < 1.5 x 528: mid; 512 mid items fit 528 resident
    ("lanes 100 512 132", "4 5"),    # 800 mid items exceed 528; 400 wide ones fit
    ("lanes 200 512 132", "5 -1"),   # 800 wide items x 2 >= 1584: wide; 800 > 528
    ("lanes 1000 512 132", "5 -1"),
    ("lanes 100 192 132", "4 4"),    # D = 192 has no wide layout: mid, its 300 items fit
    ("lanes 200 192 132", "4 -1"),   # ... 600 mid items do not, and there is no wider layout
]
# prefill route: D num_compress num_write num_continuing host_plan cooperative sms -> route
ROUTE = [
    ("route 512 10 10 -1 1 1 132", "at_once"),
    ("route 512 10 10 -1 1 0 132", "passes"),     # not scanned yet: nothing else decided
    ("route 512 10 10 2 1 0 132", "split"),       # 8 fresh > 2 continuing
    ("route 512 10 10 5 1 0 132", "passes"),      # 5 fresh <= 5 continuing
    ("route 512 10 10 2 0 1 132", "passes"),      # a device plan: passes
    ("route 512 0 10 -1 1 1 132", "passes"),      # one list only
    ("route 512 300 10 -1 1 1 132", "passes"),    # 310 records > one launch's 256
    ("route 512 300 10 10 1 0 132", "passes"),    # 290 fresh + 10 write > 256
    ("route 512 200 50 10 1 0 132", "split"),     # 190 fresh + 50 write <= 256, 10 continuing
    ("route 512 600 10 10 1 0 132", "passes"),    # more compress records than the scan takes (512)
]
# c4: D VEC count -> blocks (a block is one D = 512 row: 512 / VEC threads; a row of D is D / VEC of them;
# 2 or 4 channels each in the decode and compress kernels, 4 in the write kernel)
C4 = [("c4 512 2 33", "33"), ("c4 128 2 33", "9"), ("c4 256 2 33", "17"), ("c4 128 2 0", "0"),
      ("c4 512 4 33", "33"), ("c4 128 4 33", "9"), ("c4 128 4 8", "2"), ("c4 256 4 3", "2"),
      # channels per thread of a decode / compress launch of `count` rows: 2 up to 128 rows, then 4; then which
      # channel counts decode in the window-first form (bit 0: 2, bit 1: 4) over an fp32 ring, storing and storeless,
      # then over a bf16 ring: 2 lanes always, 4 only without stores
      ("c4vec 1", "2 1 3 1 3"), ("c4vec 128", "2 1 3 1 3"), ("c4vec 129", "4 1 3 1 3"), ("c4vec 1024", "4 1 3 1 3"),
      # the decode plan: one request per thread, 128 threads a block, at most 4096 blocks (threads then loop)
      ("c4plan 1", "1 128"), ("c4plan 128", "1 128"), ("c4plan 129", "2 128"), ("c4plan 1024", "8 128"),
      ("c4plan 524288", "4096 128"), ("c4plan 600000", "4096 128"),
      # the extend plan: num_tokens -> blocks (512 ragged rows each, at least one), threads, requests a pass (4 a thread)
      ("c4plan_extend 0", "1 512 2048"), ("c4plan_extend 4", "1 512 2048"), ("c4plan_extend 512", "1 512 2048"),
      ("c4plan_extend 513", "2 512 2048"), ("c4plan_extend 4096", "8 512 2048"),
      ("c4plan_extend 65536", "128 512 2048")]

# offline c128: D count extend -> blocks threads cluster fits. An extend below 64 records, a decode below 256
# requests: the slice form (D / 64 blocks of 256 threads a row, one cluster); from there the row form (a block of
# 512 threads a row, 4 channels a lane, no cluster)
OFFLINE = [("offline 512 1 1", "8 256 8 1"), ("offline 512 63 1", "504 256 8 1"), ("offline 512 64 1", "64 512 1 1"),
           ("offline 512 1 0", "8 256 8 1"), ("offline 512 255 0", "2040 256 8 1"),
           ("offline 512 256 0", "256 512 1 1"), ("offline 512 64 0", "512 256 8 1"), ("offline 128 3 0", "6 256 2 1"),
           ("offline 256 0 1", "0 256 4 1"), ("offline 512 1000 0", "1000 512 1 1"),
           ("offline 128 300 1", "300 512 1 1"), ("offline 256 4096 0", "4096 512 1 1"),
           ("offline 512 2147483647 1", "2147483647 512 1 1"),
           ("offline 512 2147483648 0", "2147483648 512 1 0"),
           # the slice form's channels a lane (bf16 ring, extend -> vec, threads, loads first, the row form's
           # 16-byte window sums): 4 on 16-byte loads, 2 in a bf16 ring's extend (most of its window from the fp32
           # input), 16 window blocks of 64 / vec lanes; loads first in an fp32 ring's extend only; the row form's
           # 16-byte sums everywhere but there
           ("offline_vec 1 1", "2 512 0 1"), ("offline_vec 1 0", "4 256 0 1"), ("offline_vec 0 1", "4 256 1 0"),
           ("offline_vec 0 0", "4 256 0 1")]


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("needs a C++ compiler")
    exe = tmp_path_factory.mktemp("policy") / "policy_driver"
    r = subprocess.run([compiler, "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", "-Wno-unknown-pragmas",
                        f"-I{ROOT / 'native' / 'include'}", f"-I{ROOT / 'native' / 'src'}",
                        str(ROOT / "tests" / "native" / "policy_driver.cpp"), "-o", str(exe)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr

    def ask(queries):
        out = subprocess.run([str(exe)], input="\n".join(queries) + "\n", capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout.splitlines()
    return ask


@pytest.mark.parametrize("table", [DECODE, VERIFY, COMMIT, STORE, LANES, ROUTE, PLANS, C4, OFFLINE, COPY],
                         ids=["decode", "verify", "commit", "store", "prefill lanes", "prefill route",
                              "plan upload and records", "c4", "offline c128", "metadata copy"])
def test_launch_shapes_follow_the_policy_table(driver, table):
    got = driver([q for q, _ in table])
    assert len(got) == len(table)
    wrong = [(q, want, g) for (q, want), g in zip(table, got) if g != want]
    assert not wrong, wrong
