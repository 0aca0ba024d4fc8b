"""`compassplay bench gpu`: the GPU check, in one command on one GPU (about 70 s of work on an H200).

Needs torch, transformers and this package with its light dependencies (pydantic, PyYAML):
no Ray, no vLLM, no DeepSpeed, no download (every model is a random init at a real shape).
Parts, each reported in one JSON object (and `--out FILE`):

* scorer: `bench scorer` at the Qwen2.5-1.5B and Qwen2.5-7B shapes in bfloat16, `--seq-len`
  tokens per candidate: candidates/s, naive/batched/floor seconds and their ratios, peak memory
  of each, the path each layer took, and the cosine error against a float32 per-candidate
  oracle at the same weights;
* generate: the HF engine (`engines.generation.hf`) sampling on the GPU at the 1.5B shape;
* learn: one `PolicyLearner` step (torch backend, AdamW) on those samples at the 1.5B shape;
* deepspeed (only where DeepSpeed is installed; `--skip deepspeed`): the same step through the
  DeepSpeed backend as a world of one rank, ZeRO-3 and ZeRO-2 with the optimizer offloaded to
  the CPU (DeepSpeedCPUAdam), then a checkpoint saved and loaded into a fresh learner.

    python -m compassplay.bench.gpu --json --out gpu_check.json
    python -m compassplay.bench.gpu --device cpu --shapes toy --seq-len 64   # the same code, CPU

A part that fails is reported with its error and the others still run; the exit code is 1 then.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

from compassplay.bench import model_shapes, scorer_workload
from compassplay.bench import scorer as scorer_bench
from compassplay.config import LearnerSection
from compassplay.engines.factory import make_learner
from compassplay.engines.generation.base import SamplingParams
from compassplay.engines.generation.hf import HFGenerationEngine
from compassplay.records import Trajectory


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `bench gpu`."""
    parser.add_argument("--device", default="auto", help="cuda, cpu, or auto (cuda if present)")
    parser.add_argument("--shapes", nargs="+", default=["qwen2.5-1.5b", "qwen2.5-7b"],
                        choices=model_shapes.SHAPE_NAMES, help="scorer shapes")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(scorer_workload.DTYPES))
    parser.add_argument("--n-candidates", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=1024, help="tokens per candidate (max)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--max-batch-tokens", nargs="*", default=[],
                        metavar="SHAPE=TOKENS", help="padded tokens per scorer/floor pass by "
                        "shape (default: 16384, and 4096 at qwen2.5-7b to fit 141 GB)")
    parser.add_argument("--fp32-check", type=int, default=4)
    parser.add_argument("--gen-shape", default="qwen2.5-1.5b", choices=model_shapes.SHAPE_NAMES,
                        help="shape of the generation and learner checks")
    parser.add_argument("--gen-batch", type=int, default=8)
    parser.add_argument("--gen-tokens", type=int, default=256)
    parser.add_argument("--skip", nargs="*", default=[],
                        choices=["scorer", "generate", "learn", "deepspeed"])
    parser.add_argument("--out", default="", help="also write the JSON object here")
    parser.add_argument("--json", action="store_true", help="print only the JSON object")


def _free(dev: torch.device) -> None:
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def _part(name: str, fn: Callable[[], dict], dev: torch.device, log: Callable[[str], None]
          ) -> dict:
    """Run one part; its dict, or {"error": ...} with the traceback's tail. Logs progress."""
    log(f"[gpu check] {name} ...")
    t0 = time.perf_counter()
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001  (reported; the other parts still run)
        out = {"error": f"{type(e).__name__}: {e}",
               "traceback": traceback.format_exc().splitlines()[-8:]}
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    _free(dev)
    log(f"[gpu check] {name}: {'FAILED ' + out['error'] if 'error' in out else 'ok'} "
        f"({out['wall_s']} s)")
    return out


def scorer_part(args: argparse.Namespace, shape: str) -> dict:
    """`bench scorer` at `shape`, no subspaces."""
    caps = {"qwen2.5-7b": 4096} | {k: int(v) for k, v in
                                   (s.split("=", 1) for s in args.max_batch_tokens)}
    ns = argparse.ArgumentParser()
    scorer_bench.add_arguments(ns)
    ns = ns.parse_args([])
    prompt = max(1, args.seq_len // 4)
    vars(ns).update(shape=shape, max_batch_tokens=caps.get(shape, 16384), dtype=args.dtype,
                    device=args.device, fp32_check=args.fp32_check,
                    n_candidates=args.n_candidates, seq_len=args.seq_len,
                    prompt_tokens=prompt, target_tokens=args.seq_len - prompt, n_ref=4,
                    reps=args.reps, memory="profiler", no_subspaces=True, json=True)
    out = scorer_bench.run(ns)
    out["layer_path_counts"] = {k: len(v) for k, v in out.pop("layer_paths").items()}
    return out


def _tokenizer():
    from compassplay.models.byte_tokenizer import build_byte_tokenizer  # lazy: pulls tokenizers

    return build_byte_tokenizer()


def generate_part(args: argparse.Namespace, dev: torch.device, keep: dict) -> dict:
    """HF engine on `dev`: `--gen-batch` prompts, `--gen-tokens` new tokens each (EOS off)."""
    model = model_shapes.build(args.gen_shape, scorer_workload.DTYPES[args.dtype], dev, seed=0)
    engine = HFGenerationEngine(model, _tokenizer(), eos_token_id=[])
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 256, (64,), generator=gen).tolist()
               for _ in range(args.gen_batch)]
    params = SamplingParams(max_new_tokens=args.gen_tokens, temperature=1.0, seed=0)
    engine.generate(prompts, SamplingParams(max_new_tokens=4, seed=0))  # warm-up
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.perf_counter()
    gens = engine.generate(prompts, params)
    dt = time.perf_counter() - t0
    n_tok = sum(len(g.completion_ids) for g in gens)
    keep["model"], keep["gens"] = model, gens
    return {"shape": args.gen_shape, "dtype": args.dtype, "batch": len(prompts),
            "new_tokens": n_tok, "seconds": round(dt, 3), "tokens_per_s": round(n_tok / dt, 1),
            "model_device": str(engine.device),
            "peak_mem_mb": _peak_mb(dev)}


def learn_part(args: argparse.Namespace, dev: torch.device, keep: dict) -> dict:
    """One PolicyLearner step (torch backend) on the generated samples, rewards alternating."""
    trajs = _trajectories(keep, "learner")
    model = keep["model"]
    learner = make_learner(LearnerSection(lr=1e-5, micro_batch=4), model, total_steps=1)
    probe = next(p for p in model.parameters() if p.requires_grad)
    before = probe.detach().float().clone()
    stats, dt = _timed_step(learner, trajs, dev)
    changed = float((probe.detach().float() - before).abs().max())
    return {"shape": args.gen_shape, "dtype": args.dtype, "trajectories": len(trajs),
            "tokens": stats.n_tokens, "seconds": round(dt, 3), "loss": stats.loss,
            "grad_norm": stats.grad_norm, "max_weight_change": changed,
            "weights_on": str(probe.device), "peak_mem_mb": _peak_mb(dev)}


def deepspeed_part(args: argparse.Namespace, dev: torch.device, keep: dict,
                   workdir: Path) -> dict:
    """The learner step through DeepSpeed (one rank): ZeRO-3, then ZeRO-2 with the optimizer
    offloaded; the ZeRO-3 learner's checkpoint loaded into a fresh learner (same weights)."""
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None:
        return {"skipped": "DeepSpeed is not installed"}

    trajs = _trajectories(keep, "deepspeed")
    dtype = scorer_workload.DTYPES[args.dtype]
    out: dict = {"shape": args.gen_shape, "dtype": args.dtype}
    for name, update in (("zero3", {"zero_stage": 3}),
                         ("zero2_offload_optimizer", {"zero_stage": 2,
                                                      "offload_optimizer": True})):
        cfg = LearnerSection(backend="deepspeed", lr=1e-5, micro_batch=4, **update)
        model = model_shapes.build(args.gen_shape, dtype, dev, seed=0)
        learner = make_learner(cfg, model, total_steps=2)
        before = learner.state_dict_for_sync()
        probe = next(iter(before))
        before_probe = before[probe].float().clone()
        del before
        stats, dt = _timed_step(learner, trajs, dev)
        row = {"seconds": round(dt, 3), "loss": stats.loss,
               "grad_norm": stats.grad_norm, "peak_mem_mb": _peak_mb(dev),
               "max_weight_change": float(
                   (learner.state_dict_for_sync()[probe].float() - before_probe).abs().max())}
        if name == "zero3":
            ck = workdir / "ds_checkpoint"
            learner.save(ck)
            fresh = make_learner(cfg, model_shapes.build(args.gen_shape, dtype, dev, seed=1),
                                 total_steps=2)
            fresh.load(ck)
            a, b = learner.state_dict_for_sync(), fresh.state_dict_for_sync()
            row["checkpoint_max_abs_diff"] = max(float((a[k].float() - b[k].float()).abs().max())
                                                 for k in a)
            row["checkpoint_weight_version"] = fresh.weight_version
            del fresh, a, b
        out[name] = row
        del learner, model
        _free(dev)
    return out


def _trajectories(keep: dict, part: str) -> list:
    """The generate part's samples as solver trajectories, rewards alternating 0/1."""
    if keep.get("gens") is None:
        raise RuntimeError(f"the {part} check needs the generate part's samples")
    return [Trajectory(generation=g, reward=float(i % 2), role="solver", task_type="deduction")
            for i, g in enumerate(keep["gens"])]


def _timed_step(learner, trajs: list, dev: torch.device) -> tuple:
    """(stats, seconds) of one learner step, synchronized and with the peak reset on CUDA."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.perf_counter()
    stats = learner.step(trajs)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return stats, time.perf_counter() - t0


def _peak_mb(dev: torch.device) -> float | None:
    return round(torch.cuda.max_memory_allocated(dev) / 2**20, 1) if dev.type == "cuda" else None


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(args: argparse.Namespace, log: Callable[[str], None] = _log) -> dict:
    """All parts; the JSON-ready result (also written to `args.out` when set). Progress goes
    to stderr."""
    dev = scorer_workload.resolve_device(args.device)
    import transformers

    out: dict = {"device": str(dev),
                 "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else
                 platform.processor() or "cpu",
                 "torch": torch.__version__, "transformers": transformers.__version__,
                 "cuda": torch.version.cuda, "scorer": {}}
    t0 = time.perf_counter()

    def save() -> None:  # after every part: a check cut off by a time limit keeps what it has
        out["total_s"] = round(time.perf_counter() - t0, 1)
        out["failed"] = failed_parts(out)
        if args.out:
            Path(args.out).write_text(json.dumps(out, indent=2) + "\n")

    if "scorer" not in args.skip:
        for shape in args.shapes:
            out["scorer"][shape] = _part(f"scorer {shape}", lambda s=shape: scorer_part(args, s),
                                         dev, log)
            save()
    keep: dict = {}
    if "generate" not in args.skip:
        out["generate"] = _part("generate", lambda: generate_part(args, dev, keep), dev, log)
        save()
    if "learn" not in args.skip:
        out["learn"] = _part("learn", lambda: learn_part(args, dev, keep), dev, log)
        save()
    if "deepspeed" not in args.skip:
        with tempfile.TemporaryDirectory(prefix="cp-gpu-check-") as tmp:
            out["deepspeed"] = _part("deepspeed",
                                     lambda: deepspeed_part(args, dev, keep, Path(tmp)), dev, log)
    keep.clear()
    _free(dev)
    save()
    return out


def exit_code(result: dict) -> int:
    """1 when any part failed (`compassplay bench gpu` exits with it)."""
    return 1 if result.get("failed") else 0


def failed_parts(result: dict) -> list[str]:
    """Names of the parts that reported an error."""
    parts = [(f"scorer {k}", v) for k, v in result.get("scorer", {}).items()]
    parts += [(k, result[k]) for k in ("generate", "learn", "deepspeed") if k in result]
    return [name for name, v in parts if "error" in v]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="compassplay bench gpu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    result = run(args)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return exit_code(result)


if __name__ == "__main__":
    raise SystemExit(main())
