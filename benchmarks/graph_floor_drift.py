"""Graph replay time of an empty kernel and of c128 decode B = 1 (three input sets), in alternating rounds
in one process, from torch graphs on the current and on a side stream (GPU only). It showed that graph
replay times drift within a run, so the bench measures each latency-bound row's floor beside it.
Run: python benchmarks/graph_floor_drift.py"""
import torch, pydsa, statistics
from pydsa import bench as B
from pydsa.c128 import C128Decode
D = 512
gen = torch.Generator(device="cuda").manual_seed(0)
ape = torch.randn(128, D, device="cuda", generator=gen)
empty = pydsa._abi.lib.dsa_empty_launch
def empty_call(): empty(0, torch.cuda.current_stream().cuda_stream)
def setups():
    s = B._decode_set(1, gen)
    yield "bench set", C128Decode(s[0], s[1], s[2], ape, s[3], s[4])
    st = torch.randn(4, 1, 3 * D, device="cuda", generator=gen); st[:, :, D:2 * D].uniform_(1, 30, generator=gen)
    kv = torch.randn(1, 2 * D, device="cuda", generator=gen); out = torch.empty(1, D, device="cuda")
    yield "harness-like set", C128Decode(st, kv, out, ape, torch.zeros(1, dtype=torch.int32, device="cuda"),
                                         torch.randint(1, 1000, (1,), dtype=torch.int32, device="cuda"))
    yield "bench set, seq 127 mod 128 != 0", C128Decode(s[0], s[1], s[2], ape, s[3], torch.full((1,), 5, dtype=torch.int32, device="cuda"))
ops = list(setups())
for r in range(3):
    line = [f"empty {B.graph_us([empty_call]):.3f}"]
    for name, op in ops:
        line.append(f"{name} {B.graph_us([op.launch]):.3f}")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        line.append(f"side-stream empty {B.graph_us([empty_call]):.3f}")
        line.append(f"side-stream bench set {B.graph_us([ops[0][1].launch]):.3f}")
    print(" | ".join(line), flush=True)
