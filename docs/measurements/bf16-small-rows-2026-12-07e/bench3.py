"""Tile shapes for a bfloat16 decode matmul of 4-32 rows against oneDNN's packed one:
SmolLM2-shaped random weights (30 blocks' q/k/v, o, gate/up, down and the head), fastest of 7
passes, 2 threads. Build the prototypes first, beside this file:

    gcc -O3 -march=native -fopenmp -shared -fPIC -o sl.so sl.c
    gcc -O3 -march=native -fopenmp -shared -fPIC -o sl3.so sl3.c
    python bench3.py
"""

import ctypes
import time
from pathlib import Path

import torch

HERE = Path(__file__).parent
HIDDEN, QKV, INNER = 576, 960, 1536
TILES = {"k2x8": 2, "k3x8": 3, "k4x6": 4, "k2x12": 2, "k4x4": 4}  # name -> column blocks


def fastest(fn, reps: int = 7) -> float:
    """Milliseconds of the fastest of `reps` calls after one warm-up."""
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def main() -> None:
    torch.set_num_threads(2)
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    lib = ctypes.CDLL(str(HERE / "sl.so"))
    lib.pack_w.argtypes = [ptr, ptr, i64, i64]
    tiles = ctypes.CDLL(str(HERE / "sl3.so"))
    fns = {}
    for name in TILES:
        fns[name] = getattr(tiles, name)
        fns[name].argtypes = [ptr, ptr, ptr, ptr, i64, i64, i64]
    torch.manual_seed(0)
    ws = []
    for _ in range(30):
        ws += [(torch.randn(n, k) * .05).bfloat16()
               for n, k in ((QKV, HIDDEN), (HIDDEN, HIDDEN), (2 * INNER, HIDDEN),
                            (HIDDEN, INNER))]
    ws.append((torch.randn(49152, HIDDEN) * .05).bfloat16())
    packs = []
    for w in ws:
        p = torch.empty_like(w)
        lib.pack_w(w.data_ptr(), p.data_ptr(), w.shape[0], w.shape[1])
        packs.append(p)
    for rows in (4, 8, 12, 16, 24, 32):
        xs = {k: torch.randn(rows, k).bfloat16() for k in (HIDDEN, INNER)}
        onednn = [torch.ops.mkldnn._reorder_linear_weight(w, rows) for w in ws]
        ys = [torch.empty((rows, w.shape[0]), dtype=torch.bfloat16) for w in ws]

        def run_onednn(xs=xs, onednn=onednn):
            for w, p in zip(ws, onednn, strict=True):
                torch.ops.mkldnn._linear_pointwise(xs[w.shape[1]][:, None], p, None, "none",
                                                   [], "")

        def run_tile(fn, xs=xs, ys=ys, rows=rows):
            for w, p, y in zip(ws, packs, ys, strict=True):
                fn(xs[w.shape[1]].data_ptr(), p.data_ptr(), None, y.data_ptr(), rows,
                   w.shape[0], w.shape[1])

        res = {"onednn": fastest(run_onednn)}
        for name, fn in fns.items():
            w, p, y = ws[2], packs[2], ys[2]  # correctness on the gate/up matrix
            fn(xs[HIDDEN].data_ptr(), p.data_ptr(), None, y.data_ptr(), rows, w.shape[0],
               w.shape[1])
            want = xs[HIDDEN].float() @ w.float().T
            assert float((y.float() - want).abs().max() / want.abs().max()) < 1e-2, name
            res[name] = fastest(lambda fn=fn: run_tile(fn))
        print(rows, " ".join(f"{k} {v:.1f}" for k, v in res.items()))


if __name__ == "__main__":
    main()
