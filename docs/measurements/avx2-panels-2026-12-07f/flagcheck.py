"""The decode kernels built with and without -fno-trapping-math, by compiler CC: `cp_exp`
over 4M values in [-100, 100] and the edges (NaN, +-inf, the clamps, +-0) and `cp_silu_mul`
at 16 x 1536, compared bit for bit, and `cp_silu_mul`'s fastest of 200 calls.

    python flagcheck.py gcc
    (. proxy/env.sh; python flagcheck.py "$CC")
"""

import ctypes
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

SRC = Path(__file__).parents[3] / "compassplay/engines/generation/decode_kernels.c"
P, I64 = ctypes.c_void_p, ctypes.c_int64


def main(cc: str) -> None:
    torch.set_num_threads(2)
    tmp = Path(tempfile.mkdtemp())
    edges = torch.tensor([float("nan"), float("inf"), -float("inf"), -87.3365, 88.7228, 0.0,
                          -0.0])
    x = torch.cat([torch.linspace(-100, 100, 1 << 22), edges])
    for tag, dtype, flags in (("f32", torch.float32, ["-DCP_FLOAT32"]),
                              ("bf16", torch.bfloat16, [])):
        gate_up = (torch.randn(16, 2 * 1536) * 4).to(dtype)
        exps, silus, times = {}, {}, {}
        for name, extra in (("trapping", []), ("no-trapping", ["-fno-trapping-math"])):
            so = tmp / f"{name}_{tag}.so"
            subprocess.run([cc, "-O3", "-march=native", *extra, "-fopenmp", "-shared", "-fPIC",
                            *flags, "-o", str(so), str(SRC), "-lm"], check=True)
            lib = ctypes.CDLL(str(so))
            lib.cp_exp.argtypes = [P, P, I64]
            lib.cp_silu_mul.argtypes = [P, P, I64, I64]
            exps[name] = torch.empty_like(x)
            lib.cp_exp(x.data_ptr(), exps[name].data_ptr(), x.numel())
            out = torch.empty(16, 1536, dtype=dtype)
            best = float("inf")
            for _ in range(200):
                t0 = time.perf_counter()
                lib.cp_silu_mul(gate_up.data_ptr(), out.data_ptr(), 16, 1536)
                best = min(best, time.perf_counter() - t0)
            silus[name], times[name] = out, f"{best * 1e6:.1f} us"
        a, b = exps.values()
        print(tag, "exp bit-identical:", torch.equal(a.view(torch.int32), b.view(torch.int32)),
              "silu bit-identical:", torch.equal(*(s.float() for s in silus.values())), times)


if __name__ == "__main__":
    main(sys.argv[1])
