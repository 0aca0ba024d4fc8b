#!/usr/bin/env python3
"""The GPU weight-sync device check (issue 37): one script, one GPU, torch + transformers only
(and this package), under 8 minutes, results as JSON under $OUT.

Sections (each in its own time budget; results written after every section, so a run cut
short keeps what it measured):

* ``ipc``: CUDA IPC across processes (`compassplay.sync.ipc`): the parent publishes tensors,
  a spawned child opens them on the same GPU, compares checksums and copies them; after
  `close()` the parent's memory returns to where it was.
* ``nccl``: NCCL with one rank (`NcclChannel`, world 1); two ranks on one GPU, expecting the
  channel's own refusal (`sync.gpu_members`) and NCCL's ("Duplicate GPU detected").
* ``buckets``: the bucketed broadcast (`sync.buckets.NCCLBroadcastSync`) of a state holding a
  tensor larger than a bucket, on `--device` tensors over gloo between two processes; the
  receiver's checksums and peak memory against the memory plan's staging figure.
* ``learner``: one learner step at Qwen2.5-1.5B's shape (bf16, gradient checkpointing,
  trainable=last:4: the last 4 blocks and the final norm), then the IPC publish timed two
  ways: CPU copies of the state and back to the GPU (the former publish) against sharing the
  live parameters (`workers.learner_worker.ipc_weights`).

    python deploy/gpu_sync_check.py --out "$OUT"            # on the GPU machine
    python deploy/gpu_sync_check.py --device cpu --only buckets,learner --shape toy

`--device cpu` runs what needs no CUDA (buckets over gloo, the learner at any shape); the
CUDA-only sections are recorded as skipped.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without an installed package
    sys.path.insert(0, str(ROOT))

SECTIONS = ("ipc", "nccl", "buckets", "learner")
CUDA_ONLY = ("ipc", "nccl")
RESULT = "gpu_sync_check.json"
MiB = 1 << 20


# ------------------------------------------------------------------------------ plumbing
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.environ.get("OUT", "gpu_sync_check_out"),
                   help="folder for gpu_sync_check.json (default: $OUT)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cuda: every section; cpu: the sections that need no CUDA")
    p.add_argument("--only", default=",".join(SECTIONS),
                   help=f"comma-separated sections to run (of {', '.join(SECTIONS)})")
    p.add_argument("--shape", default="qwen2.5-1.5b",
                   help="learner model shape (compassplay.bench.model_shapes; toy for tests)")
    p.add_argument("--bucket-mb", type=int, default=16,
                   help="bucket of the buckets section (MiB); its big tensor is 4x larger")
    p.add_argument("--tokens", type=int, default=1024, help="learner: tokens per sequence")
    p.add_argument("--timeout-s", type=float, default=120.0,
                   help="limit of each child process (s)")
    args = p.parse_args(argv)
    args.sections = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(args.sections) - set(SECTIONS))
    if unknown:
        p.error(f"--only: unknown sections {unknown} (expected {', '.join(SECTIONS)})")
    return args


def write_result(out: str | Path, result: dict[str, Any]) -> Path:
    """Write `result` as `out`/gpu_sync_check.json atomically (a partial run keeps the last
    complete write)."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / RESULT
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1, sort_keys=True, default=str))
    tmp.replace(path)
    return path


def checksum(t) -> str:
    """sha256 of a tensor's raw bytes (any dtype, any device)."""
    import torch

    raw = t.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes()
    return hashlib.sha256(raw).hexdigest()[:16]


def run_child(target: Callable, args: tuple, timeout_s: float) -> dict[str, Any]:
    """`target(queue, *args)` in a spawned process; its one queued dict, or why none came."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=target, args=(q, *args), daemon=True)
    proc.start()
    try:
        return q.get(timeout=timeout_s)
    except Exception:  # noqa: BLE001 - a hang or a crash: say which
        return {"ok": False, "error": f"no answer in {timeout_s:.0f} s (hung or crashed, "
                                      f"exit code {proc.exitcode})"}
    finally:
        proc.join(5)
        if proc.is_alive():
            proc.kill()


def run_children(target: Callable, argsets: list[tuple], timeout_s: float) -> list[dict]:
    """Several `target(queue, *args)` processes at once (the members of one group)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queues = [ctx.Queue() for _ in argsets]
    procs = [ctx.Process(target=target, args=(q, *a), daemon=True)
             for q, a in zip(queues, argsets, strict=True)]
    for p in procs:
        p.start()
    deadline, out = time.monotonic() + timeout_s, []
    for q, p in zip(queues, procs, strict=True):
        try:
            out.append(q.get(timeout=max(1.0, deadline - time.monotonic())))
        except Exception:  # noqa: BLE001
            out.append({"ok": False, "error": f"no answer in {timeout_s:.0f} s (hung or "
                                              f"crashed, exit code {p.exitcode})"})
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
    return out


def _guard(q, fn: Callable, *args: Any) -> None:
    try:
        q.put(fn(*args))
    except BaseException as exc:  # noqa: BLE001 - reported, not raised
        q.put({"ok": False, "error": f"{type(exc).__name__}: {exc}",
               "traceback": traceback.format_exc()[-2000:]})


# ------------------------------------------------------------------------------ ipc
def _ipc_child(q, path: str, sums: dict[str, str]) -> None:
    def work() -> dict:
        import torch

        from compassplay.sync.identity import device_id
        from compassplay.sync.ipc import open_tensor, read_update

        torch.cuda.set_device(0)
        update = read_update(path)
        mine = update["by_device"].get(device_id(torch.device("cuda", 0)))
        if mine is None:
            return {"ok": False, "error": f"no handles for this GPU in {sorted(update['by_device'])}"}
        got, copies = {}, {}
        for name, handle in mine:
            t = open_tensor(handle, 0)
            got[name] = checksum(t)
            copies[name] = t.clone()  # what a worker's load does: copy out of the handle
        same = got == sums and all(checksum(copies[n]) == sums[n] for n in sums)
        return {"ok": same, "version": update["version"], "checksums": got,
                "child_allocated_mib": torch.cuda.memory_allocated() / MiB}
    _guard(q, work)


def section_ipc(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from compassplay.sync.identity import device_id
    from compassplay.sync.ipc import publish

    dev = torch.device("cuda", 0)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated(dev)
    g = torch.Generator(device=dev).manual_seed(0)
    named = [("embed.weight", torch.randn(4096, 4096, device=dev, generator=g).bfloat16()),
             ("layers.0.bias", torch.randn(4096, device=dev, generator=g)),
             ("step", torch.arange(7, device=dev, dtype=torch.int64))]
    sums = {n: checksum(t) for n, t in named}
    held = torch.cuda.memory_allocated(dev) - base
    t0 = time.perf_counter()
    update = publish({device_id(dev): named}, 5)
    publish_s = time.perf_counter() - t0
    child = run_child(_ipc_child, (update.path, sums), args.timeout_s)
    free_before = torch.cuda.mem_get_info(dev)[0]
    update.close()
    del named
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    after = torch.cuda.memory_allocated(dev) - base
    free_after = torch.cuda.mem_get_info(dev)[0]
    return {"ok": bool(child.get("ok")) and after == 0 and not os.path.exists(update.path),
            "child": child, "publish_s": round(publish_s, 4), "held_mib": held / MiB,
            "allocated_after_close_mib": after / MiB,
            "freed_after_close_mib": (free_after - free_before) / MiB}


# ------------------------------------------------------------------------------ nccl
def _channel_member(q, port: int, rank: int, world: int) -> None:
    def work() -> dict:
        import torch

        from compassplay.sync.channel import NcclChannel

        torch.cuda.set_device(0)  # every rank on GPU 0
        ch = NcclChannel("127.0.0.1", port, rank, world, bucket_bytes=1 << 20, backend="nccl",
                         timeout_s=60)
        state = {"w": torch.arange(1 << 18, dtype=torch.float32, device="cuda")}
        if world == 1:
            ch.send(state, 1)
            ch.close()
            return {"ok": True, "sent_version": ch.version}
        return {"ok": False, "error": "the group formed with two ranks on one GPU"}
    _guard(q, work)


def _raw_nccl_member(q, port: int, rank: int) -> None:
    def work() -> dict:
        import datetime

        import torch
        import torch.distributed as dist

        torch.cuda.set_device(0)
        store = dist.TCPStore("127.0.0.1", port, 2, rank == 0,
                              timeout=datetime.timedelta(seconds=60))
        pg = dist.ProcessGroupNCCL(store, rank, 2, datetime.timedelta(seconds=60))
        t = torch.ones(4, device="cuda")
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        pg.broadcast([t], opts).wait()
        torch.cuda.synchronize()
        return {"ok": False, "error": "NCCL accepted two ranks on one GPU"}
    _guard(q, work)


def section_nccl(args: argparse.Namespace) -> dict[str, Any]:
    from compassplay.engines.training.dist import free_port

    one = run_child(_channel_member, (free_port(), 0, 1), args.timeout_s)
    port = free_port()
    ours = run_children(_channel_member, [(port, 0, 2), (port, 1, 2)], args.timeout_s)
    port = free_port()
    raw = run_children(_raw_nccl_member, [(port, 0), (port, 1)], min(args.timeout_s, 90))
    ours_refused = all("NCCL refuses" in str(r.get("error", "")) for r in ours)
    raw_text = " | ".join(str(r.get("error", "")) for r in raw)
    raw_refused = "duplicate gpu" in raw_text.lower() or "invalid usage" in raw_text.lower()
    return {"ok": bool(one.get("ok")) and ours_refused, "one_rank": one,
            "two_ranks_one_gpu_channel": ours, "channel_refused": ours_refused,
            "two_ranks_one_gpu_raw_nccl": raw, "nccl_refused_duplicate_gpu": raw_refused}


# ------------------------------------------------------------------------------ buckets
def bucket_state(bucket_bytes: int, device: str) -> dict:
    """A state with a tensor 4x the bucket (bf16), mixed dtypes and odd sizes."""
    import torch

    g = torch.Generator().manual_seed(1)
    big = 4 * bucket_bytes // 2
    return {"embed.weight": torch.randn(big, generator=g).bfloat16().to(device),
            "layers.0.w": torch.randn(1000, 333, generator=g).to(device),
            "layers.0.mask": torch.randint(0, 2, (77,), generator=g).bool().to(device),
            "norm.weight": torch.randn(333, generator=g).half().to(device)}


def _bucket_member(q, port: int, rank: int, device: str, bucket_bytes: int) -> None:
    def work() -> dict:
        import datetime

        import torch

        from compassplay.sync.buckets import NCCLBroadcastSync
        from compassplay.sync.channel import StoreBroadcaster

        cuda = device == "cuda"
        if cuda:
            torch.cuda.set_device(0)
        comm = StoreBroadcaster("127.0.0.1", port, rank, 2, "gloo",
                                datetime.timedelta(seconds=60))
        sync = NCCLBroadcastSync(comm, src=0, bucket_bytes=bucket_bytes, device=device)
        state = bucket_state(bucket_bytes, device)
        if rank == 0:
            sync.send(state, 3)
            return {"ok": True, "sent": {k: checksum(v) for k, v in state.items()}}
        del state
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        got, version = sync.receive(stage="cpu")  # one bucket on `device` at a time
        peak = torch.cuda.max_memory_allocated() - base if cuda else None
        return {"ok": version == 3, "version": version,
                "received": {k: checksum(v) for k, v in got.items()},
                "peak_staging_mib": None if peak is None else peak / MiB}
    _guard(q, work)


def section_buckets(args: argparse.Namespace) -> dict[str, Any]:
    from compassplay.engines.training.dist import free_port

    bucket = args.bucket_mb * MiB
    port = free_port()
    sender, receiver = run_children(
        _bucket_member, [(port, 0, args.device, bucket), (port, 1, args.device, bucket)],
        args.timeout_s)
    same = sender.get("sent") is not None and sender.get("sent") == receiver.get("received")
    largest = 4 * bucket  # the embed tensor: a bucket of its own
    expected = max(bucket, largest)  # memory_plan.receiver_staging for an HF receiver
    peak = receiver.get("peak_staging_mib")
    within = peak is None or peak * MiB <= expected * 1.25 + MiB
    return {"ok": bool(sender.get("ok") and receiver.get("ok") and same and within),
            "device": args.device, "bucket_mib": args.bucket_mb, "largest_tensor_mib":
            largest / MiB, "plan_staging_mib": expected / MiB, "peak_staging_mib": peak,
            "checksums_equal": same, "sender": {k: v for k, v in sender.items() if k != "sent"},
            "receiver": {k: v for k, v in receiver.items() if k != "received"}}


# ------------------------------------------------------------------------------ learner
def trainable_last(model, k: int) -> list[str]:
    """Freeze all but the last `k` transformer blocks and the final norm (trainable=last:k);
    the names left trainable."""
    layers = model.config.num_hidden_layers
    keep = tuple(f"model.layers.{i}." for i in range(layers - k, layers)) + ("model.norm.",)
    names = []
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith(keep))
        if p.requires_grad:
            names.append(name)
    return names


def section_learner(args: argparse.Namespace) -> dict[str, Any]:
    from types import SimpleNamespace

    import torch

    from compassplay.bench.model_shapes import build
    from compassplay.sync.identity import device_id
    from compassplay.sync.ipc import publish
    from compassplay.workers.learner_worker import ipc_weights

    cuda = args.device == "cuda"
    dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
    dtype = torch.bfloat16 if cuda else torch.float32

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def alloc() -> int:
        return torch.cuda.memory_allocated(dev) if cuda else 0

    t0 = time.perf_counter()
    model = build(args.shape, dtype=dtype, device=dev, seed=0).train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    names = trainable_last(model, 4)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)
    build_s = time.perf_counter() - t0
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (2, args.tokens), device=dev,
                        generator=torch.Generator(device=dev).manual_seed(0))
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.perf_counter()
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    sync()
    step_s = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated(dev) if cuda else 0
    uuid = device_id(dev)

    def timed_publish(make) -> dict:
        sync()
        before = alloc()
        if cuda:
            torch.cuda.reset_peak_memory_stats(dev)
        t = time.perf_counter()
        state = make()
        update = publish({uuid: state}, 1)
        sync()
        seconds = time.perf_counter() - t
        extra_peak = (torch.cuda.max_memory_allocated(dev) - before) if cuda else 0
        held = alloc() - before
        update.close()
        del state
        return {"seconds": round(seconds, 3), "extra_peak_mib": extra_peak / MiB,
                "extra_held_mib": held / MiB}

    copy = timed_publish(lambda: [(k, v.to(dev)) for k, v in {
        k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}.items()])
    lc = SimpleNamespace(backend="torch", zero_stage=0, offload_params=False)
    live = timed_publish(lambda: ipc_weights(model, lc, dev, dict))
    shared = ipc_weights(model, lc, dev, dict)
    same_storage = all(t.data_ptr() == p.data_ptr()
                       for (_, t), p in zip(shared, model.state_dict().values(), strict=True))
    params = sum(p.numel() for p in model.parameters())
    return {"ok": bool(torch.isfinite(out.loss).item()) and same_storage,
            "shape": args.shape, "params": params, "trainable_tensors": len(names),
            "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "tokens": 2 * args.tokens, "loss": out.loss.detach().item(), "build_s": round(build_s, 2),
            "step_s": round(step_s, 3), "step_peak_gib": peak / (1 << 30),
            "publish_copy": copy, "publish_live": live, "live_shares_storage": same_storage}


RUNNERS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "ipc": section_ipc, "nccl": section_nccl, "buckets": section_buckets,
    "learner": section_learner}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    result: dict[str, Any] = {"device": args.device, "torch": torch.__version__,
                              "cuda": torch.version.cuda, "started": time.time(),
                              "sections": {}}
    try:
        import transformers

        result["transformers"] = transformers.__version__
    except ImportError:
        result["transformers"] = None
    if args.device == "cuda":
        if not torch.cuda.is_available():
            result["error"] = "--device cuda but torch.cuda is not available"
            write_result(args.out, result)
            print(json.dumps(result))
            return 2
        result["gpu"] = torch.cuda.get_device_name(0)
    for name in args.sections:
        if name in CUDA_ONLY and args.device != "cuda":
            result["sections"][name] = {"ok": None, "skipped": "needs CUDA"}
            continue
        t0 = time.perf_counter()
        try:
            got = RUNNERS[name](args)
        except Exception as exc:  # noqa: BLE001 - recorded; the other sections still run
            got = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                   "traceback": traceback.format_exc()[-3000:]}
        got["seconds"] = round(time.perf_counter() - t0, 2)
        result["sections"][name] = got
        write_result(args.out, result)
        print(f"{name}: ok={got.get('ok')} ({got['seconds']} s)", file=sys.stderr, flush=True)
    result["ok"] = all(s.get("ok") is not False for s in result["sections"].values())
    path = write_result(args.out, result)
    print(json.dumps({"ok": result["ok"], "result": str(path)}))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
