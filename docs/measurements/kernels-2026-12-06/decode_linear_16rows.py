"""One decode matmul per shape of SmolLM2-135M at 16 rows, oneDNN-packed bfloat16 weights (as the
decoder runs them): warm (one weight again and again, cache-resident) and cold (30 different
weights in turn, streamed from memory); then a plain float32 read of 300 MB for the stream."""

import time

import torch

torch.set_num_threads(2)
dt = torch.bfloat16
M = 16
shapes = {
    "qkv": (960, 576),
    "o": (576, 576),
    "gu": (3072, 576),
    "d": (576, 1536),
    "head": (49152, 576),
}
for name, (N, K) in shapes.items():
    n = 30 if name != "head" else 4
    ws = [torch.randn(N, K).to(dt) for _ in range(n)]
    ps = [torch.ops.mkldnn._reorder_linear_weight(w, M) for w in ws]
    x = torch.randn(M, 1, K).to(dt)

    def go(idx, x=x, ps=ps):
        ts = []
        for _r in range(15):
            t0 = time.perf_counter()
            for i in idx:
                torch.ops.mkldnn._linear_pointwise(x, ps[i], None, "none", [], "")
            ts.append((time.perf_counter() - t0) / len(idx))
        ts.sort()
        return ts[2]

    warm = go([0] * n)
    cold = go(list(range(n)))
    byt = N * K * 2
    fl = 2 * M * N * K
    print(
        f"{name:5s} warm {warm * 1e6:7.1f}us ({fl / warm / 1e9:5.0f} GF/s)  cold {cold * 1e6:7.1f}us ({byt / cold / 1e9:5.1f} GB/s, {fl / cold / 1e9:5.0f} GF/s)"
    )
# stream reference
big = torch.empty(300_000_000, dtype=torch.uint8)
big.fill_(1)
ts = []
for _r in range(5):
    t0 = time.perf_counter()
    big.sum(dtype=torch.int64) if False else big.view(torch.float32).sum()
    ts.append(time.perf_counter() - t0)
print("stream GB/s", 3e8 / min(ts) / 1e9)
