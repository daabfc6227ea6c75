"""Graph replay timing with the GPU idle or busy at the start event, in alternating rounds in one
process, and the host's time to submit one replay. With the GPU idle when the start event is
recorded, the events also time the host's submission of the replay (Python, the driver), which
differs between graphs (their node counts, their kernels' parameter sizes) and between processes;
with a spin queued before the start event (bench.graph_us's default) they time the device work
alone. Cases: the empty kernel once and twice per call, c128 decode B = 256, the prefills of
1 x 128 and 64 x (1-600) tokens, the K = 3 metadata copies of 32 x 2048 and 128 x 4096. GPU only.
Run: python benchmarks/graph_start.py"""
import statistics
import time

import numpy as np
import torch

import pyplan
from pydsa import _abi
from pydsa import bench as B
from pydsa.c128 import C128Decode, C128Prefill
from pydsa.metadata import MetadataCopy

D, ROUNDS = 512, 5


def host_replay_us(calls, replays=30) -> float:
    """Median host µs of one graph.replay() of GRAPH_CALLS calls, with the GPU busy (no waiting)."""
    graph = B.capture_graph(calls)
    times = []
    for _ in range(replays):
        torch.cuda._sleep(B.GRAPH_SPIN_CYCLES)
        t0 = time.perf_counter()
        graph.replay()
        times.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
    del graph
    return statistics.median(times)


def prefill_op(gen, ape, extends, prefixes):
    ext = np.array(extends, np.int64)
    seq = ext + np.array(prefixes, np.int64)
    n, nb = int(ext.sum()), len(ext)
    state = torch.randn(nb, 1, 3 * D, device="cuda", generator=gen)
    state[:, :, D:2 * D].uniform_(1, 30, generator=gen)
    kv = torch.randn(n, 2 * D, device="cuda", generator=gen)
    return C128Prefill(state, kv, torch.empty(n, D, device="cuda"), ape,
                       torch.arange(nb, dtype=torch.int32, device="cuda"), pyplan.plan_prefill(seq, ext))


def metadata_call(gen, bs, width):
    src, dsts, _ = B._metadata_set("decode", bs, width, bs, 0, None, None, 3, gen)
    op = MetadataCopy(dsts, mode="decode")
    return lambda: op(**src)


def main():
    dev = torch.cuda.current_device()
    gen = torch.Generator(device="cuda").manual_seed(0)
    ape = torch.randn(128, D, device="cuda", generator=gen)
    empty = _abi.lib.dsa_empty_launch
    cur = lambda: torch.cuda.current_stream().cuda_stream
    s = B._decode_set(256, gen)
    rng = np.random.default_rng(1)  # the bench's 64 x (1-600) case
    ext64, pre64 = list(rng.integers(1, 601, 64)), list(rng.integers(0, 100_001, 64))
    cases = {
        "empty x1": lambda: empty(dev, cur()),
        "empty x2": lambda: (empty(dev, cur()), empty(dev, cur())),
        "decode B=256": C128Decode(s[0], s[1], s[2], ape, s[3], s[4]).launch,
        "prefill 1 x 128": prefill_op(gen, ape, [128], [0]).launch,
        "prefill 64 x (1-600)": prefill_op(gen, ape, ext64, pre64).launch,
        "metadata K=3 32x2048": metadata_call(gen, 32, 2048),
        "metadata K=3 128x4096": metadata_call(gen, 128, 4096),
    }
    got = {(name, how): [] for name in cases for how in ("idle", "busy")}
    for _ in range(ROUNDS):
        for name, call in cases.items():
            got[(name, "idle")].append(B.graph_us([call], busy_start=False))
            got[(name, "busy")].append(B.graph_us([call]))
    host = {name: host_replay_us([call]) for name, call in cases.items()}
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; graphs of {B.GRAPH_CALLS} calls; "
          f"device us per call, median of {ROUNDS} alternating rounds; host us per replay")
    print(f"{'case':24s} {'idle start':>10s} {'busy start':>10s} {'difference':>10s} "
          f"{'idle-empty':>10s} {'busy-empty':>10s} {'host/replay':>11s}")
    e_idle, e_busy = (statistics.median(got[("empty x1", h)]) for h in ("idle", "busy"))
    for name in cases:
        i, b = statistics.median(got[(name, "idle")]), statistics.median(got[(name, "busy")])
        print(f"{name:24s} {i:10.3f} {b:10.3f} {i - b:10.3f} {i - e_idle:10.3f} {b - e_busy:10.3f} {host[name]:11.2f}")


if __name__ == "__main__":
    main()
