"""Fused C kernels for the decode steps of `StaticDecoder` on CPU, built on first use.

`decode_kernels.c` holds three functions (residual add + RMS norm, rotary embedding + KV write
+ attention, SiLU x up) that replace the ~30 small torch ops between a block's four matmuls
in a decode step, and the matmul of a step of a few rows as one pass over the weights
(`small_linear`, up to 32 rows, from a copy of each weight in its layout). In the float32
library the copy is panels of 16 weight rows (32 with AVX512), each thread takes whole panels
against tiles of up to 6 (12) rows and prefetches its next panel while it works (an AVX2
build on a 2-core Zen 4, SmolLM2's blocks and head: 20 ms at 4 rows and 38 at 16 against
oneDNN's packed 44 and 50, one stream of the weights taking 17.5;
docs/measurements/avx2-panels-2026-12-07f). In a bfloat16 library built for AVX512-BF16
(on a 2-core Zen 4: 13-15 ms at 12-16 rows against oneDNN's 18-21).
One source gives two libraries: activations and KV cache in bfloat16 (the decoder on CPUs
with native bfloat16 dot products) or in float32 (`-DCP_FLOAT32`: CPUs without, such as
AVX2-only laptops). Each is compiled once per machine with the system's C compiler (`$CC`,
else `cc`/`gcc`; about 1 s: no torch headers) for this CPU (`-march=native`), kept in
`<cache>/decode_kernels/` under a key of the source, variant, compiler and CPU, and loaded
with `ctypes`. The library links `libgomp.so.1`, which resolves to the OpenMP runtime torch
has already loaded, so its parallel loops use torch's threads and thread count.

Where there is no compiler, or the build or its load fails, `load()` returns None with one log
line and the decoder keeps its torch ops (the same results up to summation order; see
`StaticDecoder` and docs/measurements/decode-kernels-2026-12-06).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import time
from pathlib import Path

import torch

from compassplay.fileio import default_cache_dir

SOURCE = Path(__file__).with_name("decode_kernels.c")
# -fno-trapping-math changes no value (the kernels do not read floating-point exception
# flags); it lets GCC turn exp_f's selects into blends, so that its loops (softmax, SiLU)
# vectorize on AVX2 too, which has no masked instructions
FLAGS = ("-O3", "-march=native", "-fno-trapping-math", "-fopenmp", "-shared", "-fPIC")
# the storage dtype -> (file tag, extra flags) of its library
VARIANTS: dict[torch.dtype, tuple[str, tuple[str, ...]]] = {
    torch.bfloat16: ("bf16", ()), torch.float32: ("f32", ("-DCP_FLOAT32",))}
BUILD_TIMEOUT_S = 120.0
KERNEL_CHOICES = ("torch", "c", "auto")

log = logging.getLogger(__name__)
# one attempt per process, cache folder and dtype
_loaded: dict[tuple[Path, torch.dtype], DecodeKernels | None] = {}

_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


def _compiler() -> str | None:
    """The C compiler to build with: `$CC`, else `cc` or `gcc` on PATH (None: none)."""
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and (path := shutil.which(name)):
            return path
    return None


def _cpu_identity() -> str:
    """The CPU model and its feature flags (`-march=native` builds for exactly these)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
        if key.strip() == "flags":
            break
    return f"{fields.get('model name', '')} | {fields.get('flags', '')}"


def build_key(compiler: str, flags: tuple[str, ...] = FLAGS) -> str:
    """A hex digest of what the library depends on: the source, flags, compiler, CPU."""
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True,
                                 timeout=30).stdout.splitlines()[:1]
    except (OSError, subprocess.SubprocessError):
        version = []
    parts = [SOURCE.read_bytes().hex(), " ".join(flags), compiler, *version, _cpu_identity()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def build(cache_dir: Path | None = None, dtype: torch.dtype = torch.bfloat16) -> Path:
    """The compiled library for this source, storage `dtype` (`VARIANTS`), compiler and CPU:
    reused from the cache or built now (atomically: concurrent builders each rename a whole
    file). Raises RuntimeError with the compiler's message when it cannot be built."""
    compiler = _compiler()
    if compiler is None:
        raise RuntimeError("no C compiler (set CC, or install cc/gcc)")
    if dtype not in VARIANTS:
        raise RuntimeError(f"no decode kernels for {dtype} (only {list(VARIANTS)})")
    tag, extra = VARIANTS[dtype]
    flags = FLAGS + extra
    folder = (cache_dir or default_cache_dir()) / "decode_kernels"
    lib = folder / f"decode_kernels-{tag}-{build_key(compiler, flags)}.so"
    if lib.exists():
        return lib
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{lib.name}.{os.getpid()}.tmp"
    t0 = time.perf_counter()
    try:
        done = subprocess.run([compiler, *flags, "-o", str(tmp), str(SOURCE), "-lm"],
                              capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"{compiler} took over {BUILD_TIMEOUT_S:.0f} s") from exc
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"{compiler} failed on {SOURCE.name}: {done.stderr.strip()[-800:]}")
    os.replace(tmp, lib)
    log.info("generation: compiled the %s decode kernels in %.1f s (%s)", tag,
             time.perf_counter() - t0, lib)
    return lib


class DecodeKernels:
    """The loaded library for storage `dtype` ("act" below: bfloat16 or float32). Every
    tensor argument must be contiguous, on CPU, in the dtype named; `FusedStep` checks that
    once per decode step (`check_layout`)."""

    def __init__(self, path: Path, dtype: torch.dtype = torch.bfloat16) -> None:
        torch.get_num_threads()  # torch (and its libgomp.so.1) is loaded before the library
        lib = ctypes.CDLL(str(path))
        lib.cp_add_rms.argtypes = [_P, _P, _P, _P, _I, _I, _F]
        lib.cp_rope_attend.argtypes = [_P] * 10 + [_I] * 6 + [_F]
        lib.cp_silu_mul.argtypes = [_P, _P, _I, _I]
        lib.cp_exp.argtypes = [_P, _P, _I]
        for fn in (lib.cp_add_rms, lib.cp_rope_attend, lib.cp_silu_mul, lib.cp_exp):
            fn.restype = None
        # the matmul of a decode step of a few rows (`small_linear`): up to 32 rows in the
        # float32 library and in a bfloat16 one built for AVX512-BF16, none otherwise
        lib.cp_small_rows.argtypes, lib.cp_small_rows.restype = [], _I
        self.small_rows = int(lib.cp_small_rows())
        # and the weight layout it reads: 16-row blocks of column pairs (bfloat16), or panels
        # of `panel_rows` rows (float32: 16, or 32 where the compiler targets AVX512)
        self._pack, self.panel_rows = None, 16
        if self.small_rows:
            lib.cp_small_linear.argtypes = [_P, _P, _P, _P, _I, _I, _I]
            lib.cp_small_linear.restype = None
            self._pack = lib.cp_pack_pairs if dtype == torch.bfloat16 else lib.cp_pack_panels
            self._pack.argtypes, self._pack.restype = [_P, _P, _I, _I], None
            if dtype == torch.float32:
                lib.cp_panel_rows.argtypes, lib.cp_panel_rows.restype = [], _I
                self.panel_rows = int(lib.cp_panel_rows())
        self.path = path
        self.dtype = dtype
        self._lib = lib

    def add_rms(self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                out: torch.Tensor, eps: float) -> None:
        """x [B, H] float32 += delta [B, H] act (None: nothing added), then
        out [B, H] act = RMS norm of x times weight [H] float32."""
        rows, hidden = x.shape
        self._lib.cp_add_rms(x.data_ptr(), None if delta is None else delta.data_ptr(),
                             weight.data_ptr(), out.data_ptr(), rows, hidden, eps)

    def rope_attend(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                    pos: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                    bias: torch.Tensor, reads: torch.Tensor, scratch: torch.Tensor,
                    out: torch.Tensor, heads: tuple[int, int, int], t: int, scale: float
                    ) -> None:
        """Attention of the new column t. qkv [B, (nh + 2 nkv) d] act; cos, sin [C, d]
        float32 (sin signed); pos [B] int64; keys [B, nkv, d, C], values [B, nkv, C, d]
        act (column t written); bias [B, C] float32; reads [B, 5] int64 (`shared_reads`:
        the columns each row reads from another row, which must hold the same keys and
        values there); scratch [B nkv (nh / nkv) C] float32; out [B, nh d] act;
        heads = (nh, nkv, d)."""
        nh, nkv, d = heads
        self._lib.cp_rope_attend(qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(),
                                 pos.data_ptr(), keys.data_ptr(), values.data_ptr(),
                                 bias.data_ptr(), reads.data_ptr(), scratch.data_ptr(),
                                 out.data_ptr(), qkv.shape[0], nh, nkv, d, values.shape[2], t,
                                 scale)

    def silu_mul(self, gate_up: torch.Tensor, out: torch.Tensor) -> None:
        """out [B, I] = silu(gate) * up, gate_up [B, 2 I] act (gate columns first)."""
        rows, inter = out.shape
        self._lib.cp_silu_mul(gate_up.data_ptr(), out.data_ptr(), rows, inter)

    def small_weight(self, w: torch.Tensor) -> torch.Tensor | None:
        """w [N, K] copied once into the layout `small_linear` reads, or None where it
        cannot take w: in bfloat16 each 16-row block's column pairs side by side
        (`cp_pack_pairs`; N a multiple of 16, K even), in float32 panels of `panel_rows`
        rows, each input column's weights side by side (`cp_pack_panels`; N a multiple of
        `panel_rows`)."""
        if self._pack is None or w.dtype != self.dtype or w.dim() != 2 or \
                not w.is_contiguous() or w.device.type != "cpu":
            return None
        n, k = w.shape
        if n % self.panel_rows or (self.dtype == torch.bfloat16 and k % 2):
            return None
        packed = torch.empty_like(w)
        self._pack(w.data_ptr(), packed.data_ptr(), n, k)
        return packed

    def small_linear(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None
                     ) -> torch.Tensor:
        """x [M, 1, K] @ W [N, K]^T + b [N] -> [M, 1, N] in the library's dtype,
        1 <= M <= `small_rows`, w = `small_weight(W)`: one pass over the weights for the M
        rows (float32 sums; bfloat16: one rounding at the end)."""
        rows, n, k = x.shape[0], w.shape[0], w.shape[1]
        if not 0 < rows <= self.small_rows:
            raise ValueError(f"small_linear: {rows} rows (1..{self.small_rows})")
        for name, t in (("x", x), ("w", w), ("b", b)):  # read as plain arrays
            if t is not None and (t.dtype != self.dtype or not t.is_contiguous()):
                raise ValueError(f"small_linear: {name} must be a contiguous {self.dtype} "
                                 "tensor")
        if x.shape[-1] != k or (b is not None and b.shape != (n,)):
            raise ValueError(f"small_linear: x {tuple(x.shape)}, w {tuple(w.shape)} and b "
                             f"{None if b is None else tuple(b.shape)} do not match")
        out = torch.empty((rows, 1, n), dtype=self.dtype)
        self._lib.cp_small_linear(x.data_ptr(), w.data_ptr(),
                                  None if b is None else b.data_ptr(), out.data_ptr(), rows,
                                  n, k)
        return out

    def exp(self, x: torch.Tensor) -> torch.Tensor:
        """e^x of a contiguous float32 tensor with the kernels' own exp (softmax, SiLU)."""
        out = torch.empty_like(x)
        self._lib.cp_exp(x.data_ptr(), out.data_ptr(), x.numel())
        return out


def load(cache_dir: Path | None = None, dtype: torch.dtype = torch.bfloat16
         ) -> DecodeKernels | None:
    """The kernels for storage `dtype`, built if needed; None (logged once per process)
    where they cannot be."""
    folder = cache_dir or default_cache_dir()
    if (folder, dtype) in _loaded:
        return _loaded[(folder, dtype)]
    try:
        kernels: DecodeKernels | None = DecodeKernels(build(folder, dtype), dtype)
    except (RuntimeError, OSError) as exc:
        log.warning("generation: the fused decode kernels are unavailable (%s); decode steps "
                    "use torch ops", exc)
        kernels = None
    _loaded[(folder, dtype)] = kernels
    return kernels
