# ruff: noqa  (a throwaway timer kept as it ran; see README.md)
"""Run: PYTHONPATH=<checkout> python <this file> [args] -- see README.md for what it measured."""
import time

import torch
import torch.nn.functional as F

torch.set_num_threads(2)
def tm(f, n=200):
    for _ in range(20): f()
    ts=[]
    for _ in range(n):
        t0=time.perf_counter(); f(); ts.append(time.perf_counter()-t0)
    ts.sort(); return round(ts[len(ts)//10]*1e6,1)
bf=torch.bfloat16
M=16
with torch.inference_mode():
  for (N,K) in [(960,576),(576,576),(3072,576),(576,1536),(49152,576)]:
    w=torch.randn(N,K).to(bf); x=torch.randn(M,1,K).to(bf)
    pw=torch.ops.mkldnn._reorder_linear_weight(w, M)
    a=tm(lambda: torch.ops.mkldnn._linear_pointwise(x, pw, None, "none", [], ""))
    b=tm(lambda: F.linear(x,w))
    wf=w.float(); xf=x.float(); pf=torch.ops.mkl._mkl_reorder_linear_weight(wf, M)
    c=tm(lambda: torch.ops.mkl._mkl_linear(xf, pf, wf, None, M))
    fl=2*M*N*K; by=N*K*2
    print(N,K,"packed bf16",a,"us  F.linear bf16",b," mkl f32",c, f" flop-bound@386 {fl/386e3:.1f} us stream@26GB/s {by/26e3:.1f} us")
