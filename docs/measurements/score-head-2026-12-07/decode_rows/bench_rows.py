"""Decode-step matmuls of 4-32 rows over 30 SmolLM2-shaped blocks (float32, 2 threads):
oneDNN's packed sgemm (what the decoder uses above 8 rows) against three C kernels tried for
9-32 rows: `chunk8.c` (the 8-row dot-product loop over row chunks), `tiles_avx2.c` (AVX2
register tiles of 3 weight rows x 4 input rows, and 2 x 6). Fastest of 10 passes, ms.

    python bench_rows.py      # builds the kernels with cc -O3 -march=native -fopenmp
"""

import ctypes
import subprocess
import tempfile
import time
from pathlib import Path

import torch

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]


def build() -> dict[str, ctypes._CFuncPtr]:
    here, tmp = Path(__file__).parent, Path(tempfile.mkdtemp())
    libs = {}
    for src in ("chunk8", "tiles_avx2"):
        subprocess.run(["cc", "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-o",
                        str(tmp / f"{src}.so"), str(here / f"{src}.c")], check=True)
        libs[src] = ctypes.CDLL(str(tmp / f"{src}.so"))
    fns = {"chunk8": libs["chunk8"].sl, "i3x4": libs["tiles_avx2"].sl4,
           "i2x6": libs["tiles_avx2"].sl5}
    for f in fns.values():
        f.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3
    return fns


def main() -> None:
    torch.set_num_threads(2)
    kernels = build()
    g = torch.Generator().manual_seed(0)
    blocks = [[torch.randn(s, generator=g) for s in SHAPES] for _ in range(30)]
    for m in (4, 8, 12, 16, 24, 32):
        padded = (m + 11) // 12 * 12  # rows the tiles may read past m
        xs = [torch.randn(padded, 1, s[1], generator=g) for s in SHAPES]
        outs = [torch.empty(padded, 1, s[0]) for s in SHAPES]
        packs = [[torch.ops.mkldnn._reorder_linear_weight(w, m) for w in ws] for ws in blocks]

        def onednn(m=m, xs=xs, packs=packs) -> None:
            for pk in packs:
                for x, p in zip(xs, pk, strict=True):
                    torch.ops.mkldnn._linear_pointwise(x[:m], p, None, "none", [], "")

        def kernel(fn, m=m, xs=xs, outs=outs) -> None:
            for ws in blocks:
                for x, w, o in zip(xs, ws, outs, strict=True):
                    fn(x.data_ptr(), w.data_ptr(), None, o.data_ptr(), m, *w.shape)

        runs = {"onednn": onednn, **{k: (lambda fn=fn: kernel(fn)) for k, fn in kernels.items()}}
        for fn in kernels.values():  # each against F.linear first
            for w, x, o in zip(blocks[0], xs, outs, strict=True):
                fn(x.data_ptr(), w.data_ptr(), None, o.data_ptr(), m, *w.shape)
                assert torch.allclose(o[:m], torch.nn.functional.linear(x[:m], w), atol=1e-3)
        best = dict.fromkeys(runs, float("inf"))
        for _ in range(10):
            for name, run in runs.items():
                t0 = time.perf_counter()
                run()
                best[name] = min(best[name], time.perf_counter() - t0)
        print(m, {k: round(v * 1e3, 1) for k, v in best.items()}, flush=True)


if __name__ == "__main__":
    main()
