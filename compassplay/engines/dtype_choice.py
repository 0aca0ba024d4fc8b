"""bfloat16 matmuls where this CPU runs them faster: `SamplingSection.decode_dtype` (the static
decoder's matmul dtype) and `LearnerSection.autocast` (the learner's forward under
`torch.autocast`), each "auto" read from one choice measured once per machine and kept.

"auto" takes bfloat16 where this CPU's bfloat16 decode matmuls are `BF16_MARGIN` times faster
than float32's (native bfloat16 dot products: AVX512-BF16, AMX), else the weights' own dtype.
Timing at start-up alone made the choice differ between runs: under Ray the proposer and solver
actors time while the other loads its model, and two threads per process on two cores turn a
1.5 ms timing into 30-60 ms whenever the other process runs. So the two dtypes are timed
interleaved (a burst of load hits both), the fastest of `REPS` is kept, and the result is
written to `<cache>/decode_dtype.json` keyed by CPU, torch version, thread count and the
model's block shapes: every later run on the machine reads the same choice (delete the file to
measure again).

The same entry keeps how a float32 decoder packs its weights (`float32_pack`: MKL's or
oneDNN's packed sgemm, `decoder_support.pack_kind`), timed the same way: on an AVX2-only
Zen 3 MKL's small-row sgemm ran at a third of oneDNN's speed, so neither is right everywhere.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import logging
import os
import platform
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.nn.functional as F

from compassplay.engines.generation.decoder_support import (
    FLOAT32_PACKS,
    onednn_available,
    pack_kind,
    unsupported_reason,
)
from compassplay.fileio import default_cache_dir

DECODE_DTYPES = ("model", "bfloat16", "auto")
AUTOCAST_CHOICES = ("none", "bfloat16", "auto")
BF16_MARGIN = 1.25  # `auto` takes bfloat16 only when its decode matmuls are this much faster
REPS = 9  # interleaved timings per dtype; the fastest of each is compared
CACHE_FILE = "decode_dtype.json"

log = logging.getLogger(__name__)
_LOGGED: set[tuple[str, str]] = set()  # (cache file, machine key) whose kept choice was logged


def _block_shapes(model: torch.nn.Module) -> list[tuple[int, int]]:
    """[out, in] of one block's decode matmuls: fused q/k/v, o, fused gate/up, down."""
    cfg = model.config
    hidden = int(cfg.hidden_size)
    inter = int(getattr(cfg, "intermediate_size", None) or 4 * hidden)  # GPT-2: n_inner None
    nh = cfg.num_attention_heads
    nkv = getattr(cfg, "num_key_value_heads", None) or nh
    d = getattr(cfg, "head_dim", None) or hidden // nh
    return [((nh + 2 * nkv) * d, hidden), (hidden, nh * d), (2 * inter, hidden), (hidden, inter)]


def _block_matmuls(model: torch.nn.Module, rows: int, dtype: torch.dtype,
                   kind: str | None) -> Callable[[], None]:
    """One block's decode matmuls (x [rows, in]) on random weights in `dtype`, through
    weights packed for `rows` as `kind` ("mkl", "onednn"; None: `F.linear`)."""
    g = torch.Generator().manual_seed(0)
    shapes = _block_shapes(model)
    ws = [torch.randn(shape, generator=g).to(dtype) for shape in shapes]
    xs = [torch.randn((rows, shape[1]), generator=g).to(dtype) for shape in shapes]
    if kind == "mkl":
        packs = [torch.ops.mkl._mkl_reorder_linear_weight(w, rows) for w in ws]

        def run() -> None:
            for w, pw, x in zip(ws, packs, xs, strict=True):
                torch.ops.mkl._mkl_linear(x, pw, w, None, rows)
    elif kind == "onednn":
        packs = [torch.ops.mkldnn._reorder_linear_weight(w, rows) for w in ws]

        def run() -> None:
            for pw, x in zip(packs, xs, strict=True):
                torch.ops.mkldnn._linear_pointwise(x, pw, None, "none", [], "")
    else:
        def run() -> None:
            for w, x in zip(ws, xs, strict=True):
                F.linear(x, w)
    return run


def _fastest(runs: dict, reps: int) -> dict:
    """Per key, the fastest of `reps` timings (s) of its callable, the callables timed in
    turn so that load from other processes meets all alike (after one untimed warm-up call
    each: first calls pick kernels)."""
    for run in runs.values():
        run()
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(reps):
        for key, run in runs.items():
            t0 = time.perf_counter()
            run()
            best[key] = min(best[key], time.perf_counter() - t0)
    return best


def decode_matmul_seconds(model: torch.nn.Module, rows: int = 16, reps: int = REPS,
                          float32_pack: str = "mkl") -> dict[torch.dtype, float]:
    """Fastest of `reps` timings (s) of one block's decode matmuls (x [rows, in]) in float32
    (packed as `float32_pack`) and in bfloat16 on CPU, as `StaticDecoder` runs them (through
    weights packed for `rows` where `pack_kind` has a packing for the dtype), the two dtypes
    timed in turn."""
    return _fastest({
        torch.float32: _block_matmuls(model, rows, torch.float32,
                                      pack_kind(torch.float32, float32_pack)),
        torch.bfloat16: _block_matmuls(model, rows, torch.bfloat16,
                                       pack_kind(torch.bfloat16))}, reps)


def float32_pack_seconds(model: torch.nn.Module, rows: int = 16, reps: int = REPS
                         ) -> dict[str, float]:
    """Fastest of `reps` timings (s) of one block's float32 decode matmuls per packing of
    `FLOAT32_PACKS` this torch has (MKL's, oneDNN's), timed in turn."""
    kinds = [k for k in FLOAT32_PACKS if pack_kind(torch.float32, k) == k]
    return _fastest({k: _block_matmuls(model, rows, torch.float32, k) for k in kinds}, reps)


def machine_key(model: torch.nn.Module) -> str:
    """What the choice depends on: CPU model, torch version, torch threads, block shapes."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    shapes = ",".join(f"{o}x{i}" for o, i in _block_shapes(model))
    packs = "/".join(str(pack_kind(dt)) for dt in (torch.float32, torch.bfloat16))
    return (f"{cpu} | torch {torch.__version__} | {torch.get_num_threads()} threads | {shapes}"
            f" | packed {packs}")


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("generation: ignoring unreadable %s (%s); measuring again", path, exc)
        return {}
    return data if isinstance(data, dict) else {}


def _write(path: Path, key: str, entry: dict) -> None:
    """Add `entry` under `key`, atomically (concurrent writers: the last rename wins whole)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = _read(path)
        data[key] = entry
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError as exc:  # a read-only cache still decodes; it measures again next time
        log.warning("generation: could not keep the decode dtype choice in %s (%s)", path, exc)


@contextlib.contextmanager
def _dir_lock(folder: Path) -> Iterator[None]:
    """An exclusive flock on `folder` (created if missing), so that processes starting at once
    measure one after another; no lock where the folder cannot be made or opened."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _kept(path: Path, key: str) -> dict | None:
    """The entry under `key`, if whole (an entry from before `float32_pack` is measured
    again)."""
    entry = _read(path).get(key)
    if isinstance(entry, dict) and entry.get("dtype") in ("bfloat16", "float32") and \
            entry.get("float32_pack") in FLOAT32_PACKS:
        return entry
    return None


def measured_choice(model: torch.nn.Module, cache_dir: Path | None = None) -> dict:
    """The kept "auto" entry for this machine and model shape ({"dtype": "bfloat16" or
    "float32", "float32_ms", "bfloat16_ms", "float32_pack": "mkl" or "onednn",
    "float32_pack_ms": {kind: ms}, "measured_at"}), measured and written first
    where there is none: by one process, while the others starting beside it wait for it
    (a flock on the cache folder) and then read its entry."""
    path = (cache_dir or default_cache_dir()) / CACHE_FILE
    key = machine_key(model)
    entry = _kept(path, key)
    if entry is None:
        with _dir_lock(path.parent):
            entry = _kept(path, key)
            if entry is None:
                return _measure_and_keep(model, path, key)
    if (str(path), key) not in _LOGGED:  # once a process: every engine and learner reads it
        _LOGGED.add((str(path), key))
        log.info("generation: decoding in %s, float32 packed by %s (kept in %s for %s; delete "
                 "it to measure again)", entry["dtype"], entry["float32_pack"], path, key)
    return entry


def _measure_and_keep(model: torch.nn.Module, path: Path, key: str) -> dict:
    packs = float32_pack_seconds(model)
    pack = min(packs, key=packs.get) if packs else "mkl"
    t = decode_matmul_seconds(model, float32_pack=pack)
    fp32, bf16 = t[torch.float32], t[torch.bfloat16]
    entry = {"dtype": "bfloat16" if fp32 >= BF16_MARGIN * bf16 else "float32",
             "float32_ms": round(fp32 * 1e3, 4), "bfloat16_ms": round(bf16 * 1e3, 4),
             "float32_pack": pack,
             "float32_pack_ms": {k: round(v * 1e3, 4) for k, v in packs.items()},
             "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    _write(path, key, entry)
    log.info("generation: decode matmuls take %.2f ms in float32 (packed by %s; %s) and %.2f "
             "ms in bfloat16 on this CPU; decoding in %s (kept in %s)", fp32 * 1e3, pack,
             ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in packs.items()), bf16 * 1e3,
             entry["dtype"], path)
    return entry


def _resolve(field: str, choices: tuple[str, ...], choice: str, model: torch.nn.Module,
             measured: Callable[[], dict], static_only: bool) -> torch.dtype | None:
    """choices[0] -> None, "bfloat16" -> bfloat16, "auto" -> bfloat16 when the model's
    weights are float32 on a CPU (and, with `static_only`, the static decoder runs it) where
    `measured()` (`measured_choice`'s entry) found bfloat16 faster, else None; another value
    is a ValueError naming `field`."""
    if choice not in choices:
        raise ValueError(f"{field}: unknown value {choice!r} (expected one of {choices})")
    if choice != "auto":
        return torch.bfloat16 if choice == "bfloat16" else None
    p = next(model.parameters())
    if p.device.type != "cpu" or p.dtype != torch.float32 or (
            static_only and unsupported_reason(model)):
        return None
    return torch.bfloat16 if measured()["dtype"] == "bfloat16" else None


def resolve_float32_pack(model: torch.nn.Module, cache_dir: Path | None = None) -> str:
    """How a float32 static decoder of `model` packs its CPU decode matmuls: the measured
    `float32_pack` of `measured_choice` for a float32 CPU model, else "mkl" (unused off
    CPU)."""
    return _float32_pack(model, lambda: measured_choice(model, cache_dir))


def _float32_pack(model: torch.nn.Module, measured: Callable[[], dict]) -> str:
    p = next(model.parameters())
    if p.device.type != "cpu" or p.dtype != torch.float32 or not onednn_available():
        return "mkl"
    return measured()["float32_pack"]


def resolve_decoding(choice: str, model: torch.nn.Module, cache_dir: Path | None = None
                     ) -> tuple[torch.dtype | None, str]:
    """A static decoder's (matmul dtype, float32 packing) for `decode_dtype` = `choice`:
    `resolve_decode_dtype`, then, for a float32 decoder, `resolve_float32_pack` ("mkl", unused,
    for a bfloat16 one), from one read of the kept measurement."""
    measured = functools.cache(lambda: measured_choice(model, cache_dir))
    dtype = _resolve("decode_dtype", DECODE_DTYPES, choice, model, measured, static_only=True)
    return dtype, (_float32_pack(model, measured) if dtype is None else "mkl")


def resolve_decode_dtype(choice: str, model: torch.nn.Module,
                         cache_dir: Path | None = None) -> torch.dtype | None:
    """The static decoder's matmul dtype for `choice`: None for "model" (the weights' own),
    bfloat16 for "bfloat16", and for "auto" bfloat16 when the model's weights are float32 on a
    CPU where `measured_choice` found bfloat16 faster, else None."""
    return _resolve("decode_dtype", DECODE_DTYPES, choice, model,
                    lambda: measured_choice(model, cache_dir), static_only=True)


def resolve_autocast(choice: str, model: torch.nn.Module, cache_dir: Path | None = None,
                     field: str = "learner.autocast") -> torch.dtype | None:
    """A `torch.autocast` dtype for `choice` (LearnerSection.autocast,
    ScorerSection.reference_autocast; `field` names it in errors): None for "none", bfloat16
    for "bfloat16", and for "auto" bfloat16 when the model's weights are float32 on a CPU where
    `measured_choice` found bfloat16 matmuls faster, else None (a GPU config picks its
    precision with `model.dtype` and DeepSpeed's bf16 mode)."""
    return _resolve(field, AUTOCAST_CHOICES, choice, model,
                    lambda: measured_choice(model, cache_dir), static_only=False)
