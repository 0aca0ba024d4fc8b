# ruff: noqa  (a throwaway timer kept as it ran; see README.md)
"""Run: PYTHONPATH=<checkout> python <this file> [args] -- see README.md for what it measured."""
import time

import torch

torch.set_num_threads(2)
def tm(f, n=300):
    for _ in range(20): f()
    ts=[]
    for _ in range(n):
        t0=time.perf_counter(); f(); ts.append(time.perf_counter()-t0)
    ts.sort(); return round(ts[len(ts)//10]*1e6,1)
bf=torch.bfloat16
def add_rms(x, o, w):
    x.add_(o)
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
    return (w * (x * r)).to(bf)
x=torch.randn(16,1,576); o=torch.randn(16,1,576).to(bf); w=torch.randn(576)
t0=time.perf_counter()
c=torch.compile(add_rms, dynamic=True)
with torch.inference_mode():
    c(x,o,w)
    print("compile s", time.perf_counter()-t0)
    print("eager", tm(lambda: add_rms(x,o,w)), "compiled", tm(lambda: c(x,o,w)))
    x2=torch.randn(7,1,576); o2=torch.randn(7,1,576).to(bf)
    t0=time.perf_counter(); c(x2,o2,w); print("new B s", time.perf_counter()-t0)
    xa=x.clone(); xb=x.clone()
    print("equal", torch.equal(add_rms(xa,o,w), c(xb,o,w)), (add_rms(xa,o,w).float()-c(xb,o,w).float()).abs().max())
