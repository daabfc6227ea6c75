"""Host time per call of the per-step call patterns beside an empty ctypes launch (GPU only):
one-shot and prepared decode, one-shot prefill with two-pass plans (pyplan records, DevicePlan,
with and without planning), MetadataCopy with new sources and bound. Run: python benchmarks/host_calls.py"""
import numpy as np, torch, pyplan, pydsa, json, sys
from pydsa.bench import host_vs_empty, _metadata_set
from pydsa import _calls
print("torch", torch.__version__, "exchange api", hasattr(torch.Tensor, "__dlpack_c_exchange_api__"), "compiled path", _calls.available)
D=512; dev="cuda"; g=torch.Generator(device=dev).manual_seed(0)
ape=torch.randn(128,D,device=dev)
res={}
for b in (1,32,256):
    st=torch.rand(b+3,1,3*D,device=dev)+1; kv=torch.randn(b,2*D,device=dev); out=torch.empty(b,D,device=dev)
    idx=torch.arange(b,dtype=torch.int32,device=dev); sl=torch.randint(1,1000,(b,),dtype=torch.int32,device=dev)
    res[f"decode B={b} one-shot"]=host_vs_empty(lambda: pydsa.c128_decode(st,kv,out,ape,idx,sl), n=2000, fetch_stream=True)
    op=pydsa.C128Decode(st,kv,out,ape,idx,sl)
    res[f"decode B={b} launch()"]=host_vs_empty(op.launch, n=2000, fetch_stream=True)
for name,ext in (("1x128",[128]),("8x(1-600)",[5,600,130,1,77,300,129,2])):
    ext=np.array(ext,np.int64); seq=ext+1000; n=int(ext.sum()); b=len(ext)
    plan=pyplan.plan_prefill(seq,ext)
    st=torch.rand(b,1,3*D,device=dev)+1; kv=torch.randn(n,2*D,device=dev); out=torch.empty(n,D,device=dev); idx=torch.arange(b,dtype=torch.int32,device=dev)
    res[f"prefill {name} one-shot pyplan"]=host_vs_empty(lambda: pydsa.c128_prefill(st,kv,out,ape,idx,plan), n=2000, fetch_stream=True)
    res[f"prefill {name} plan+one-shot"]=host_vs_empty(lambda: pydsa.c128_prefill(st,kv,out,ape,idx,pyplan.plan_prefill(seq,ext)), n=2000, fetch_stream=True)
    dp=pydsa.DevicePlan(4096,16)
    res[f"prefill {name} DevicePlan replan+one-shot"]=host_vs_empty(lambda: pydsa.c128_prefill(st,kv,out,ape,idx,dp.plan(seq,ext,num_tokens=n)), n=2000, fetch_stream=True)
    res[f"prefill {name} DevicePlan one-shot"]=host_vs_empty(lambda: pydsa.c128_prefill(st,kv,out,ape,idx,dp), n=2000, fetch_stream=True)
src,dsts,_=_metadata_set("decode",32,2048,32,0,None,None,3,g)
op=pydsa.MetadataCopy(dsts)
srcs=[{k:v.clone() for k,v in src.items()} for _ in range(2)]
i=[0]
def fresh():
    i[0]^=1; op(**srcs[i[0]])
res["metadata K=3 new sources"]=host_vs_empty(fresh, n=2000, fetch_stream=True)
op.bind(**src)
res["metadata K=3 launch()"]=host_vs_empty(op.launch, n=2000, fetch_stream=True)
for k,(a,e) in res.items(): print(f"{k:45s} {a:6.2f} us  empty {e:5.2f} us  ratio {a/e:.2f}")
