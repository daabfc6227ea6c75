"""Host time per one-shot call of the binding (B = 0 or all-padding calls: the C library returns at once), on the host backend: the per-call cost of reading and judging the arguments and filling the params."""
import sys, time, statistics
import numpy as np, torch
import pydsa, pyplan
d = 512
st = torch.randn(4, 1, 3 * d); ape = torch.randn(128, d)
kv0 = torch.randn(0, 2 * d); out0 = torch.empty(0, d); i0 = torch.zeros(0, dtype=torch.int32)
ext = np.array([5], np.int64); plan = pyplan.plan_prefill(ext, ext)
kvp = torch.randn(5, 2 * d); outp = torch.empty(5, d); ip = torch.zeros(1, dtype=torch.int32)
ver_kv = torch.randn(0, 2 * d)
b, v = 4, 3
vst = torch.randn(b * 5, 1, 3 * d); vkv = torch.randn(b * v, 2 * d); vout = torch.empty(b * v, d)
idx = torch.arange(b, dtype=torch.int32); vseq = torch.full((b,), -1, dtype=torch.int32); bank = idx + b
cases = {
 "decode B=0": lambda: pydsa.c128_decode(st, kv0, out0, ape, i0, i0),
 "prefill 5 tokens": lambda: pydsa.c128_prefill(st, kvp, outp, ape, ip, plan),
 "commit B=0": lambda: pydsa.c128_commit(i0, i0, i0, i0, load_indices=i0, num_drafts=2),
 "prepared decode launch": pydsa.C128Decode(st, kv0, out0, ape, i0, i0).launch,
 "verify B=4 padding": lambda: pydsa.c128_verify(vst, vkv, vout, ape, idx, vseq, bank),
}
calls = 20000
if sys.argv[1:] == ["c4"]:  # the c4 binding instead: python benchmarks/profile/binding_host.py c4
    import os
    sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))
    from binding_host_c4 import cases
    calls = 5000
print("pydsa from", pydsa.__file__)
for name, fn in cases.items():
    for _ in range(2000): fn()
    r = []
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(calls): fn()
        r.append((time.perf_counter() - t) / calls * 1e6)
    print(f"{name:36s} {statistics.median(r):.3f} us")
