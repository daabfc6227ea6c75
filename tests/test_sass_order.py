"""What the records_ahead promise is for, in the machine code: with it, the c4 decode reads its record (and the
store its record and slot) *before* the grid-dependency wait (SASS `ACQBULK`). ptxas decides the order, and once
scheduled the wait ahead of a lone predicated load, so the promise bought nothing while every test passed; this
compiles the two kernels' sources for sm_90 and reads their SASS. Needs nvcc, cuobjdump and nvdisasm (the CUDA
toolkit's, or PyPI's nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm, which CI installs); skips cleanly without."""
from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _tool(name):
    """The CUDA toolkit's `name` on PATH, or the one PyPI's nvidia-cuda-<name> installs."""
    found = shutil.which(name)
    if found:
        return found
    spec = importlib.util.find_spec("nvidia")
    for base in (spec.submodule_search_locations or []) if spec else []:
        for hit in pathlib.Path(base).glob(f"cu*/bin/{name}"):
            return str(hit)
    return None


NVCC, CUOBJDUMP, NVDISASM = shutil.which("nvcc"), _tool("cuobjdump"), _tool("nvdisasm")
pytestmark = pytest.mark.skipif(not (NVCC and CUOBJDUMP and NVDISASM),
                                reason="needs nvcc, cuobjdump and nvdisasm (cuobjdump -sass runs nvdisasm)")


def _sass(source: str, tmp_path) -> dict[str, list[str]]:
    """{kernel's mangled name: its SASS instructions in order} of native/src/<source> built for sm_90."""
    cubin = tmp_path / (source + ".cubin")
    subprocess.run([NVCC, "-std=c++17", "-O3", "--expt-relaxed-constexpr", "-arch=sm_90", "-cubin",
                    f"-I{ROOT / 'native/include'}", f"-I{ROOT / 'native/src'}", "-o", str(cubin),
                    str(ROOT / "native/src" / source)], check=True, capture_output=True, timeout=600)
    env = dict(os.environ, NVDISASM_PATH=str(pathlib.Path(NVDISASM).parent))
    dump = subprocess.run([CUOBJDUMP, "-sass", str(cubin)], check=True, capture_output=True, text=True,
                          env=env).stdout
    kernels, name = {}, None
    for line in dump.splitlines():
        if "Function :" in line:
            name = line.split("Function :")[1].strip()
            kernels[name] = []
        elif name is not None:
            m = re.search(r"/\*[0-9a-f]{4,}\*/\s+(.*?);", line)
            if m:
                kernels[name].append(m.group(1).strip())
    return kernels


def _wait(code: list[str]) -> int:
    """The index of the grid-dependency wait (SASS `ACQBULK`)."""
    return next(i for i, ins in enumerate(code) if ins.startswith("ACQBULK"))


def _loads_before_wait(code: list[str]) -> int:
    return sum(1 for ins in code[:_wait(code)] if re.match(r"(@!?P\d+ )?LDG", ins))


def test_the_c4_decode_reads_its_record_before_the_wait_in_every_records_instance(tmp_path):
    kernels = _sass("c4.cu", tmp_path)
    # c4_decode_kernel<S, kC4Records (0), VEC, kStore>: fp32 and bf16 rings, 2 and 4 lanes, with and without stores
    records = {k: v for k, v in kernels.items() if re.search(r"c4_decode_kernelI(f|NS_4Bf16E)Li0ELi[24]ELb[01]E", k)}
    assert len(records) == 8, sorted(kernels)
    late = [k for k, code in records.items() if _loads_before_wait(code) < 1]
    assert late == [], "record read after the wait"
    storing = [k for k in records if "Lb1E" in k]
    assert all(_loads_before_wait(records[k]) >= 2 for k in storing), "slot read after the wait"  # record + slot


def test_the_store_over_records_reads_its_record_and_slot_before_the_wait(tmp_path):
    kernels = _sass("store.cu", tmp_path)
    plain = {k: v for k, v in kernels.items() if re.search(r"kv_store_kernelILi[24]ELb0ELi0E", k)}
    assert len(plain) == 2, sorted(kernels)
    assert all(_loads_before_wait(code) >= 2 for code in plain.values())


def _wait_and_first_store(code: list[str]) -> tuple[int, int]:
    wait = _wait(code)
    return wait, next(i for i in range(wait, len(code)) if re.match(r"(@!?P\d+ )?STG", code[i]))


def test_the_c4_decode_loads_its_window_before_its_row_store_and_widens_after(tmp_path):
    """The window-first form (launch_policy.h, C4Form::window_first): every 2-lane decode and every storeless 4-lane
    one (fp32 and bf16 rings, records and seq_lens) issues its input row, its window's 16 ring loads and 8 ape loads
    before the row's ring store (one trip fewer on a closing row's chain), and widens no bf16 value between those
    loads (a widening there waits for its load, so the next row's loads would leave a trip later); a storing 4-lane
    decode keeps the plain form, its row stored before any window load (measured faster there)."""
    kernels = _sass("c4.cu", tmp_path)
    decodes = {k: v for k, v in kernels.items() if re.search(r"c4_decode_kernelI(f|NS_4Bf16E)Li[01]ELi[24]ELb[01]E", k)}
    assert len(decodes) == 16, sorted(kernels)
    for name, code in decodes.items():
        wait, store = _wait_and_first_store(code)
        loads = sum(1 for ins in code[wait:store] if re.match(r"(@!?P\d+ )?LDG", ins))
        if re.search(r"Li4ELb1E", name):
            assert loads <= 8, (name, loads)  # the record and the token's input row
            continue
        assert loads >= 4 + 16 + 8, (name, loads)  # input row, window, ape rows
        last = max(i for i in range(wait, store) if re.match(r"(@!?P\d+ )?LDG", code[i]))
        widening = [ins for ins in code[wait:last] if re.search(r"\bPRMT\b|IMAD\.U32 .*0x10000|SHF\.L\.U32 .*0x10,", ins)]
        assert widening == [], (name, widening[:4])


def test_the_c4_verify_reads_its_input_rows_before_its_entry(tmp_path):
    """A draft's input rows (written into the ring after its entry) are read with its window: after the first store
    of a verify at most the 4-lane store's two operand loads remain (reading them after the entry was one more
    memory trip at the end of a draft's chain: 8-10 loads there before)."""
    kernels = _sass("c4.cu", tmp_path)
    verify = {k: v for k, v in kernels.items() if "c4_verify_kernel" in k}
    assert len(verify) == 8, sorted(kernels)
    for name, code in verify.items():
        first = next(i for i in range(_wait(code), len(code)) if re.match(r"(@!?P\d+ )?(STG|RED)", code[i]))
        late = sum(1 for ins in code[first:] if re.match(r"(@!?P\d+ )?LDG", ins))
        assert late <= 2, (name, late)


def test_the_offline_slice_form_over_an_fp32_ring_extends_with_its_store_operands_read_early(tmp_path):
    """The offline c128 slice form's loads-first form (launch_policy.h, offline_loads_first): an extend over an fp32
    ring reads the cache slot, norm weights and rotary pairs with the window, none after the cluster's last barrier;
    every other slice instance reads them after it (measured faster there)."""
    kernels = _sass("c128_offline.cu", tmp_path)
    slices = {k: v for k, v in kernels.items() if "offline_slice_kernel" in k}
    assert len(slices) == 6, sorted(kernels)
    for name, code in slices.items():
        last = max(i for i, ins in enumerate(code) if ins.startswith("UCGABAR_WAIT"))
        late = [ins for ins in code[last:] if re.match(r"(@!?U?P\w+ )?LDG", ins)]
        if re.search(r"offline_slice_kernelIfLi2E", name):
            assert late == [], name
        else:
            assert len(late) >= 3, (name, late)


def _waits_on_loads(code: list[str]) -> int:
    """How often a warp on its straight path waits for a load before it issues another: an instruction reading a
    register an outstanding LDG writes, with an LDG after it (each such wait is one more memory trip)."""
    last_load = max(k for k, ins in enumerate(code) if " LDG" in f" {ins}")
    pending, waits = set(), 0
    for k, ins in enumerate(code[:last_load]):
        op, _, args = re.sub(r"^@!?U?P\w+\s+", "", ins).partition(" ")
        regs = [[int(x) for x in re.findall(r"\bR(\d+)\b", a)] for a in args.split(",")]
        reads = {r for a in (regs[1:] if not op.startswith("ST") else regs) for r in a}
        if pending & reads:
            waits, pending = waits + 1, set()
        if op.startswith("LDG") and regs and regs[0]:
            width = 4 if ".128" in op else 2 if ".64" in op else 1
            pending |= set(range(regs[0][0], regs[0][0] + width))
    return waits


def test_the_offline_row_form_reads_its_window_four_channels_a_lane_in_few_trips(tmp_path):
    """The offline row form (launch_policy.h): 4 channels a lane (16-byte loads of the fp32 input, ape and ring, 8-byte
    loads of a bf16 ring), each window block's rows issued together: a warp of a decode or of an fp32 ring's extend
    waits on its loads at most 10 times over the whole window (the form of a thread a channel waited 15-18 times).
    A bf16 ring's extend reads a record the input holds whole from the input alone, and any other's rows, from the
    ring (bf16) or the input (fp32), by two predicated loads into the same words (load_state_or_lanes): the two
    copies of the window in its SASS wait at most 16 times together (14 on sm_90 with nvcc 13.0; read by a branch
    between the two widths it waited 57 times, a trip a row). The slice form's bf16 extend (2 channels a lane)
    alike: at most 9 (7; 17 by the branch)."""
    kernels = _sass("c128_offline.cu", tmp_path)
    rows = {k: v for k, v in kernels.items() if "offline_row_kernel" in k}
    assert len(rows) == 6, sorted(kernels)
    for name, code in rows.items():
        wide = sum(1 for ins in code if re.search(r"\bLDG\.E\.128\b", ins))
        assert wide >= 32, (name, wide)  # the ape rows at least (8 rows x 4 window blocks)
        assert _waits_on_loads(code) <= (16 if re.search(r"Bf16ELi2E", name) else 10), (name, _waits_on_loads(code))
    slice_bf16_extend = [v for k, v in kernels.items() if re.search(r"offline_slice_kernelINS_4Bf16ELi2ELi2E", k)]
    assert len(slice_bf16_extend) == 1, sorted(kernels)
    assert _waits_on_loads(slice_bf16_extend[0]) <= 9, _waits_on_loads(slice_bf16_extend[0])
