"""The float32 small-row matmul before this session (rows streamed against unpacked weights,
up to 8 rows) and after (`cp_pack_panels` panels with prefetch, up to 32 rows) against
oneDNN's packed float32 matmul: SmolLM2-shaped random weights (30 blocks' q/k/v, o,
gate/up, down and the head), fastest of 7 passes, 2 threads, ms. Both libraries are built
here with compiler CC (`proxy/cc` for the AVX2 build) from the sources given.

    git show 250edc8:compassplay/engines/generation/decode_kernels.c > /tmp/old.c
    python cmp_small.py gcc /tmp/old.c 1,2,4,8,12,16,32
    (. proxy/env.sh; python cmp_small.py proxy/cc /tmp/old.c 1,2,4,8,12,16,32)
"""

import ctypes
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from bench_pan import HIDDEN, INNER, fastest, smollm2_weights  # this folder's helpers

NEW = Path(__file__).parents[3] / "compassplay/engines/generation/decode_kernels.c"
P, I64 = ctypes.c_void_p, ctypes.c_int64


def build(cc: str, src: str, out: Path) -> ctypes.CDLL:
    """The float32 library of `src`, built with `cc` as decode_kernels.py builds it."""
    subprocess.run([cc, "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC",
                    "-DCP_FLOAT32", "-o", str(out), src, "-lm"], check=True)
    lib = ctypes.CDLL(str(out))
    lib.cp_small_linear.argtypes = [P, P, P, P, I64, I64, I64]
    return lib


def main(cc: str, old_src: str, rows_list: list[int]) -> None:
    torch.set_num_threads(2)
    tmp = Path(tempfile.mkdtemp())
    old, new = build(cc, old_src, tmp / "old.so"), build(cc, str(NEW), tmp / "new.so")
    new.cp_pack_panels.argtypes = [P, P, I64, I64]
    new.cp_panel_rows.restype = I64
    print("panel rows", new.cp_panel_rows())
    ws = smollm2_weights()
    packs = []
    for w in ws:
        p = torch.empty_like(w)
        new.cp_pack_panels(w.data_ptr(), p.data_ptr(), *w.shape)
        packs.append(p)
    for rows in rows_list:
        xs = {k: torch.randn(rows, k) for k in (HIDDEN, INNER)}
        ys = [torch.empty(rows, w.shape[0]) for w in ws]
        w, p, y = ws[2], packs[2], ys[2]
        new.cp_small_linear(xs[HIDDEN].data_ptr(), p.data_ptr(), None, y.data_ptr(), rows,
                            *w.shape)
        res = {"max |err|": float((y - xs[HIDDEN] @ w.T).abs().max())}
        if rows <= 8:
            res["before"] = fastest(lambda xs=xs, ys=ys, rows=rows: [
                old.cp_small_linear(xs[w.shape[1]].data_ptr(), w.data_ptr(), None,
                                    y.data_ptr(), rows, *w.shape) for w, y in zip(ws, ys, strict=True)])
        res["after"] = fastest(lambda xs=xs, ys=ys, rows=rows: [
            new.cp_small_linear(xs[w.shape[1]].data_ptr(), p.data_ptr(), None, y.data_ptr(),
                                rows, *w.shape) for w, p, y in zip(ws, packs, ys, strict=True)])
        onednn = [torch.ops.mkldnn._reorder_linear_weight(w, rows) for w in ws]
        res["onednn"] = fastest(lambda xs=xs, onednn=onednn: [
            torch.ops.mkldnn._linear_pointwise(xs[w.shape[1]], p, None, "none", [], "")
            for w, p in zip(ws, onednn, strict=True)])
        print(rows, {k: round(v, 2) if k != "max |err|" else v for k, v in res.items()},
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], [int(r) for r in sys.argv[3].split(",")])
