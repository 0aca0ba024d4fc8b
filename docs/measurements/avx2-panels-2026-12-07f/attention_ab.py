"""`cp_rope_attend` of two sources against each other: outputs compared bit for bit and the
time of 30 layers' calls (each layer its own cache, so the cache streams from memory as in
a decode step; fastest of 10 after one untimed call), float32 and bfloat16 libraries built
with compiler CC. SmolLM2's heads (9 query, 3 KV, d 64), `rows` rows, column t, capacity
t + 213. OLD takes the signature before `reads` (250edc8), NEW the one after; NEW also runs
with every row reading its own cache.

    git show 250edc8:compassplay/engines/generation/decode_kernels.c > /tmp/old.c
    python attention_ab.py gcc /tmp/old.c ../../../compassplay/engines/generation/decode_kernels.c 12 600
"""

import ctypes
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

NH, NKV, D = 9, 3, 64
P, I64, F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


def build(cc: str, src: str, flags: list[str], out: Path, new: bool) -> ctypes.CDLL:
    subprocess.run([cc, "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", *flags, "-o",
                    str(out), src, "-lm"], check=True)
    lib = ctypes.CDLL(str(out))
    lib.cp_rope_attend.argtypes = [P] * (10 if new else 9) + [I64] * 6 + [F]
    return lib


def run_layers(lib: ctypes.CDLL, new: bool, layers: list, tables: dict, dtype: torch.dtype,
               rows: int, t: int) -> torch.Tensor:
    """One call per layer; the layers' outputs stacked."""
    outs = []
    for qkv, kc, vc in layers:
        out = torch.empty(rows, NH * D, dtype=dtype)
        extra = [tables["reads"].data_ptr()] if new else []
        lib.cp_rope_attend(qkv.data_ptr(), tables["cos"].data_ptr(), tables["sin"].data_ptr(),
                           tables["pos"].data_ptr(), kc.data_ptr(), vc.data_ptr(),
                           tables["bias"].data_ptr(), *extra, tables["scratch"].data_ptr(),
                           out.data_ptr(), rows, NH, NKV, D, kc.shape[-1], t, 0.125)
        outs.append(out)
    return torch.stack(outs)


def main(cc: str, old_src: str, new_src: str, rows: int, t: int) -> None:
    torch.set_num_threads(2)
    cap, tmp = t + 213, Path(tempfile.mkdtemp())
    g = torch.Generator().manual_seed(0)
    for tag, dtype, flags in (("f32", torch.float32, ["-DCP_FLOAT32"]),
                              ("bf16", torch.bfloat16, [])):
        libs = {"old": build(cc, old_src, flags, tmp / f"old_{tag}.so", False),
                "new": build(cc, new_src, flags, tmp / f"new_{tag}.so", True)}
        layers = [(torch.randn(rows, (NH + 2 * NKV) * D, generator=g).to(dtype),
                   torch.randn(rows, NKV, D, cap, generator=g).to(dtype),
                   torch.randn(rows, NKV, cap, D, generator=g).to(dtype)) for _ in range(30)]
        tables = {"cos": torch.randn(cap, D, generator=g), "sin": torch.randn(cap, D, generator=g),
                  "pos": torch.randint(0, t + 1, (rows,), generator=g),
                  "bias": torch.zeros(rows, cap),
                  "reads": torch.tensor([[0, b, 0, 0, 0] for b in range(rows)]),
                  "scratch": torch.empty(rows * NKV, (NH // NKV) * cap)}
        outs = {}
        for name, lib in libs.items():
            outs[name] = run_layers(lib, name == "new", layers, tables, dtype, rows, t)
            best = float("inf")
            for _ in range(10):
                t0 = time.perf_counter()
                run_layers(lib, name == "new", layers, tables, dtype, rows, t)
                best = min(best, time.perf_counter() - t0)
            print(tag, name, f"{best * 1e3:.2f} ms / 30 layers", flush=True)
        print(tag, "bit-identical:", torch.equal(outs["old"], outs["new"]))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
