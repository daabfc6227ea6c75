"""Device us per call in CUDA graphs of 20 calls, captured by torch.cuda.graph (as the bench) and by
the CUDA runtime directly on a non-blocking stream (as the C harness), in alternating rounds in one
process: the empty kernel once and twice per call, c128 decode B = 1 (one kernel) and the prefill of
the bench's 64 x (1-600) case (two kernels: the split). It asks whether a torch-captured graph costs
more per kernel node, which would make two-kernel calls look slower in the bench than in the harness
by more than the empty kernel beside them accounts for. With --no-torch LIBRARY [STAGE] it times only
the empty kernel of the given libdsa_kernels.so, runtime-captured, in a process that loads torch only
as far as STAGE: none (default), import (import torch), init (torch.cuda.init()), tensor (a CUDA
tensor allocated), ew (an elementwise op run), mm (a matmul run), op (both) or big (an 8 GiB
tensor allocated, nothing run). GPU only.
Run: python benchmarks/graph_nodes.py [--no-torch path/libdsa_kernels.so [STAGE]] [path of
libcudart.so; default /usr/local/cuda/lib64/libcudart.so]"""
import ctypes as C
import ctypes.util
import statistics
import sys

NO_TORCH = sys.argv[1:2] == ["--no-torch"]
STAGES = ("none", "import", "init", "tensor", "ew", "mm", "op", "big")
if NO_TORCH:
    LIBRARY = sys.argv[2]
    has_stage = len(sys.argv) > 3 and sys.argv[3] in STAGES
    STAGE = sys.argv[3] if has_stage else "none"
    del sys.argv[1:4 if has_stage else 3]  # what is left: the optional libcudart path
else:
    import numpy as np
    import torch

    import pyplan
    from pydsa import _abi
    from pydsa import bench as B
    from pydsa.c128 import C128Decode, C128Prefill

D = 512
CALLS, REPLAYS, ROUNDS = 20, 30, 5  # bench.GRAPH_CALLS calls per graph


def load_cudart():
    for path in sys.argv[1:2] + ["/usr/local/cuda/lib64/libcudart.so", ctypes.util.find_library("cudart")]:
        try:
            return C.CDLL(path)
        except (OSError, TypeError):
            continue
    raise SystemExit("no libcudart.so found; pass its path")


cudart = load_cudart()


def check(err, what):
    if err:
        raise RuntimeError(f"{what}: CUDA error {err}")


def raw_graph_us(call, calls=CALLS) -> float:
    """Like bench.graph_us with busy_start=False (each replay timed from an idle GPU, its host
    submission included), with the capture, instantiation and replay made by the CUDA runtime:
    `call(stream)` issues one call on the raw stream handle; the graph holds `calls` calls."""
    s, g, e = C.c_void_p(), C.c_void_p(), C.c_void_p()
    check(cudart.cudaStreamCreateWithFlags(C.byref(s), 1), "stream")
    call(s.value)
    check(cudart.cudaStreamSynchronize(s), "sync")
    check(cudart.cudaStreamBeginCapture(s, 0), "begin capture")
    for _ in range(calls):
        call(s.value)
    check(cudart.cudaStreamEndCapture(s, C.byref(g)), "end capture")
    check(cudart.cudaGraphInstantiate(C.byref(e), g, C.c_ulonglong(0)), "instantiate")
    a, b = C.c_void_p(), C.c_void_p()
    check(cudart.cudaEventCreate(C.byref(a)) or cudart.cudaEventCreate(C.byref(b)), "events")
    check(cudart.cudaGraphLaunch(e, s), "launch")
    check(cudart.cudaStreamSynchronize(s), "sync")
    times = []
    for _ in range(REPLAYS):
        cudart.cudaEventRecord(a, s)
        cudart.cudaGraphLaunch(e, s)
        cudart.cudaEventRecord(b, s)
        check(cudart.cudaEventSynchronize(b), "event sync")
        ms = C.c_float()
        cudart.cudaEventElapsedTime(C.byref(ms), a, b)
        times.append(ms.value * 1e3 / calls)
    cudart.cudaGraphExecDestroy(e), cudart.cudaGraphDestroy(g)
    cudart.cudaEventDestroy(a), cudart.cudaEventDestroy(b), cudart.cudaStreamDestroy(s)
    return statistics.median(times)


def load_torch_to(stage):
    if stage == "none":
        return
    import torch as t
    if STAGES.index(stage) >= STAGES.index("init"):
        t.cuda.init()
    if STAGES.index(stage) >= STAGES.index("tensor"):
        x = t.ones(256, 256, device="cuda")
    if stage in ("ew", "op"):
        (x * 2 + 1).sum().item()
    if stage in ("mm", "op"):
        (x @ x).sum().item()
    if stage == "big":
        x = t.empty(8 << 30, dtype=t.uint8, device="cuda")


def main_without_torch():
    load_torch_to(STAGE)
    lib = C.CDLL(LIBRARY)
    empty = lib.dsa_empty_launch
    one = lambda st: empty(0, C.c_void_p(st))
    two = lambda st: (empty(0, C.c_void_p(st)), empty(0, C.c_void_p(st)))
    # name: (call, calls per graph); the last three ask whether the node count of the graph or
    # the kernels per call set the cost
    cases = {"empty x1": (one, CALLS), "empty x2": (two, CALLS), "empty x1, 40 calls": (one, 2 * CALLS),
             "empty x2, 10 calls": (two, CALLS // 2), "empty x1, 80 calls": (one, 4 * CALLS)}
    got = {name: [] for name in cases}
    for _ in range(ROUNDS):  # alternating rounds
        for name, (call, calls) in cases.items():
            got[name].append(raw_graph_us(call, calls))
    print(f"torch loaded up to stage '{STAGE}': device us per call, runtime-captured, median of {ROUNDS} alternating rounds")
    for name, times in got.items():
        print(f"{name:24s} {statistics.median(times):10.3f}")


def main():
    assert B.GRAPH_CALLS == CALLS
    dev = torch.cuda.current_device()
    gen = torch.Generator(device="cuda").manual_seed(0)
    ape = torch.randn(128, D, device="cuda", generator=gen)
    empty = _abi.lib.dsa_empty_launch
    s = B._decode_set(1, gen)
    decode = C128Decode(s[0], s[1], s[2], ape, s[3], s[4])
    rng = np.random.default_rng(1)  # the bench's 64 x (1-600) case
    ext = np.array(rng.integers(1, 601, 64), np.int64)
    seq = ext + np.array(rng.integers(0, 100_001, 64), np.int64)
    n = int(ext.sum())
    state = torch.randn(64, 1, 3 * D, device="cuda", generator=gen)
    state[:, :, D:2 * D].uniform_(1, 30, generator=gen)
    kv = torch.randn(n, 2 * D, device="cuda", generator=gen)
    prefill = C128Prefill(state, kv, torch.empty(n, D, device="cuda"), ape, torch.arange(64, dtype=torch.int32, device="cuda"),
                          pyplan.plan_prefill(seq, ext))
    cur = lambda: torch.cuda.current_stream().cuda_stream
    cases = {  # name: (torch call, raw call on a stream)
        "empty x1": (lambda: empty(dev, cur()), lambda st: empty(dev, st)),
        "empty x2": (lambda: (empty(dev, cur()), empty(dev, cur())), lambda st: (empty(dev, st), empty(dev, st))),
        "decode B=1": (decode.launch, lambda st: decode.launch(st)),
        "prefill 64 x (1-600)": (prefill.launch, lambda st: prefill.launch(st)),
    }
    got = {(name, how): [] for name in cases for how in ("torch", "raw")}
    for _ in range(ROUNDS):
        for name, (in_torch, raw) in cases.items():
            got[(name, "torch")].append(B.graph_us([in_torch], busy_start=False))  # as raw_graph_us
            got[(name, "raw")].append(raw_graph_us(raw))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; device us per call, median of {ROUNDS} alternating rounds")
    print(f"{'case':24s} {'torch graph':>12s} {'raw graph':>10s} {'difference':>11s}")
    for name in cases:
        t, r = statistics.median(got[(name, "torch")]), statistics.median(got[(name, "raw")])
        print(f"{name:24s} {t:12.3f} {r:10.3f} {t - r:11.3f}")


if __name__ == "__main__":
    main_without_torch() if NO_TORCH else main()
