"""The c4 cases of binding_host.py (python benchmarks/profile/binding_host.py c4; an older build: PYTHONPATH=<its
--target folder>:<site-packages> python -S ...): host time per call of the c4 binding on the host backend, over a
plan of padding records (the C library does next to nothing): the core one-shot c4_decode, pydsa.sglang's
compress_forward and c4_layer, and a prepared launch. Needs tests/ on sys.path (binding_host.py puts it there)."""
import torch, pydsa
from pydsa import sglang
from pydsa.sglang import compress as sg
from test_sglang_c4 import SWA, _context
ctx = _context("cpu", 2, 64)
plan = sg.CompressorDecodePlan.generate(4, ctx["rpi"], ctx["r2t"], ctx["f2s"], torch.tensor([0, 0]), SWA, 8)  # padding
m, ix = ctx["main"], ctx["indexer"]
kv, ikv = torch.randn(2, 2048), torch.randn(2, 512)
out = torch.empty(2, 512)
main = pydsa.C4Compressor(m["ring"], m["ape"].reshape(8, 512)); ind = pydsa.C4Compressor(ix["ring"], ix["ape"].reshape(8, 128))
ring3 = m["ring"].view(-1, 4, 2048); ape = m["ape"].view(-1, 512)
cases = {
 "c4_decode main+indexer (records)": lambda: pydsa.c4_decode(main, kv, indexer=ind, indexer_kv_score=ikv, records=plan.plan_d),
 "sglang compress_forward c4": lambda: sglang.compress_forward(ring3, kv, ape, plan, head_dim=512, compress_ratio=4, out=out, is_online=False),
 "sglang c4_layer (no stores)": lambda: sglang.c4_layer(dict(kv_score_buffer=m["ring"], kv_score_input=kv, ape=m["ape"], store=None),
                                                      dict(kv_score_buffer=ix["ring"], kv_score_input=ikv, ape=ix["ape"], store=None), plan, None),
 "prepared C4Decode launch": pydsa.C4Decode(main, kv, indexer=ind, indexer_kv_score=ikv, records=plan.plan_d).launch,
}
