"""Prototype tilings of the float32 small-row matmul against oneDNN's packed one: SmolLM2-
shaped random weights (30 blocks' q/k/v, o, gate/up, down and the head), fastest of 7
passes, 2 threads, ms. The prototype library exports `pack16` (W [N, K] -> [N/16][K][16])
and kernels f(x, packed, y, m, n, k). Under the AVX2 proxy:

    . proxy/env.sh && $CC -O3 -march=native -fopenmp -shared -fPIC -o pan_kb.so pan_kb.c
    python bench_pan.py ./pan_kb.so kb_all,kb128,kb256,kb256_54,kb384 4,12,16,24
"""

import ctypes
import sys
import time

import torch

HIDDEN, QKV, INNER = 576, 960, 1536
P, I64 = ctypes.c_void_p, ctypes.c_int64


def fastest(fn, reps: int = 7) -> float:
    """Milliseconds of the fastest of `reps` calls after one warm-up."""
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def smollm2_weights() -> list[torch.Tensor]:
    """Random float32 weights of SmolLM2-135M's shapes (seed 0): 30 blocks' q/k/v, o,
    gate/up and down, then the head."""
    torch.manual_seed(0)
    ws = []
    for _ in range(30):
        ws += [torch.randn(n, k) * .05 for n, k in ((QKV, HIDDEN), (HIDDEN, HIDDEN),
                                                     (2 * INNER, HIDDEN), (HIDDEN, INNER))]
    ws.append(torch.randn(49152, HIDDEN) * .05)
    return ws


def main(path: str, names: list[str], rows_list: list[int]) -> None:
    torch.set_num_threads(2)
    lib = ctypes.CDLL(path)
    lib.pack16.argtypes = [P, P, I64, I64]
    fns = {}
    for name in names:
        fns[name] = getattr(lib, name)
        fns[name].argtypes = [P, P, P, I64, I64, I64]
    ws = smollm2_weights()
    packs = []
    for w in ws:
        p = torch.empty_like(w)
        lib.pack16(w.data_ptr(), p.data_ptr(), w.shape[0], w.shape[1])
        packs.append(p)
    for rows in rows_list:
        xs = {k: torch.randn(rows, k) for k in (HIDDEN, INNER)}
        onednn = [torch.ops.mkldnn._reorder_linear_weight(w, rows) for w in ws]
        ys = [torch.empty(rows, w.shape[0]) for w in ws]
        res = {"onednn": fastest(lambda xs=xs, onednn=onednn: [
            torch.ops.mkldnn._linear_pointwise(xs[w.shape[1]], p, None, "none", [], "")
            for w, p in zip(ws, onednn, strict=True)])}
        for name, fn in fns.items():
            w, p, y = ws[2], packs[2], ys[2]  # correctness on the gate/up matrix
            fn(xs[HIDDEN].data_ptr(), p.data_ptr(), y.data_ptr(), rows, *w.shape)
            want = xs[HIDDEN] @ w.T
            assert float((y - want).abs().max() / want.abs().max()) < 1e-4, name
            res[name] = fastest(lambda fn=fn, xs=xs, ys=ys, rows=rows: [
                fn(xs[w.shape[1]].data_ptr(), p.data_ptr(), y.data_ptr(), rows, *w.shape)
                for w, p, y in zip(ws, packs, ys, strict=True)])
        print(rows, " ".join(f"{k} {v:.1f}" for k, v in res.items()), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2].split(","), [int(r) for r in sys.argv[3].split(",")])
