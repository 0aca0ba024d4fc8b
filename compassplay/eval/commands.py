"""`compassplay eval`: evaluate a model, or grade a predictions file without a model.

    compassplay eval --model smollm2 --benchmarks cruxeval-o,math500 --data-dir DIR \\
        --out results.json [--limit N] [--batch-size 8] [--max-new-tokens N] \\
        [--samples 10 --temperature 0.8]
    compassplay eval --predictions preds.jsonl --benchmark cruxeval-o --data-dir DIR

The results JSON holds per-benchmark greedy accuracy with its binomial standard error
(sqrt(p(1-p)/n)), n, skipped reason, seconds, items/s, the data file's sha256 and, with
`--samples N`, unbiased pass@k (Chen et al. 2021) for k = 1, 2, 4, ..., N; and what the result
was made with: package versions, git commit, dtype, prompt version. Per-item predictions
(greedy, then each sample) go to the sibling `<out stem>.predictions.jsonl`. The exit code is
1 when every benchmark was skipped (no data), 2 for a usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from compassplay.eval.benchmarks import BENCHMARKS, check_name, find_data, parse_names
from compassplay.eval.eval_records import EvalResult
from compassplay.eval.provenance import provenance

DATA_DIR_ENV = "COMPASSPLAY_DATA_DIR"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="smollm2 | tiny | HF dir | run checkpoint/run dir | hub id")
    p.add_argument("--tokenizer", default=None, help="tokenizer dir or hub id (default: the "
                   "model's, or the run config's for checkpoints)")
    p.add_argument("--benchmarks", default="all",
                   help=f"comma list of {', '.join(BENCHMARKS)} or all/code/math")
    p.add_argument("--data-dir", default=os.environ.get(DATA_DIR_ENV),
                   help=f"folder with the data files (default ${DATA_DIR_ENV})")
    p.add_argument("--data-file", action="append", default=[], metavar="NAME=PATH",
                   help="data file of one benchmark (e.g. livecodebench=lcb.jsonl); repeatable")
    p.add_argument("--out", default=None, help="results JSON (predictions go next to it)")
    p.add_argument("--limit", type=int, default=None, help="first N items per benchmark")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="default: per benchmark (code 256-512, math 1024)")
    p.add_argument("--device", default=None, help="cpu / cuda (default: cuda when available)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--samples", type=int, default=0, metavar="N",
                   help="sampled completions per item besides the greedy one, for pass@k "
                        "(k = 1, 2, 4, ..., N); 0 = greedy only")
    p.add_argument("--temperature", type=float, default=0.8,
                   help="sampling temperature of --samples (> 0; default 0.8)")
    p.add_argument("--chat", choices=["auto", "yes", "no"], default="auto",
                   help="chat template: auto = when the tokenizer has one")
    p.add_argument("--workers", type=int, default=2, help="sandbox / math grading workers")
    p.add_argument("--timeout-s", type=float, default=10.0, help="per-item grading timeout")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--predictions", default=None, metavar="FILE.jsonl",
                   help="grade this file of {id, prediction} lines instead of running a model")
    p.add_argument("--benchmark", default=None, help="the benchmark of --predictions")


def _data_files(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep:
            raise SystemExit(f"error: --data-file wants NAME=PATH with NAME in {list(BENCHMARKS)}")
        try:
            check_name(name)
        except ValueError as exc:
            raise SystemExit(f"error: --data-file {pair}: {exc}") from None
        out[name] = path
    return out


def predictions_path(out: Path) -> Path:
    return out.with_name(out.stem + ".predictions.jsonl")


def write_results(results: list[EvalResult], out: Path, meta: dict) -> Path:
    """Write the results JSON and the sibling predictions jsonl; returns the latter."""
    out.parent.mkdir(parents=True, exist_ok=True)
    preds = predictions_path(out)
    with preds.open("w") as f:
        for r in results:
            for item in r.items:
                f.write(item.model_dump_json() + "\n")
    doc = dict(meta, predictions_file=preds.name,
               benchmarks={r.benchmark: r.summary() for r in results})
    out.write_text(json.dumps(doc, indent=1) + "\n")
    return preds


def _print_table(results: list[EvalResult]) -> None:
    for r in results:
        if r.skipped:
            print(f"{r.benchmark:18s} skipped: {r.skipped}")
            continue
        passes = "".join(f"  pass@{k} {v:.4f}" for k, v in r.pass_at_k.items())
        print(f"{r.benchmark:18s} accuracy {r.accuracy:.4f} ± {r.accuracy_stderr or 0.0:.4f}  "
              f"n={r.n}{passes}  {r.seconds:.1f}s  {r.items_per_s:.2f} items/s")


def _grade_predictions(args: argparse.Namespace) -> int:
    from compassplay.eval.grader import Grader, grade_file  # lazy: keeps the CLI start light

    if not args.benchmark:
        print(f"error: --predictions needs --benchmark, one of {', '.join(BENCHMARKS)}",
              file=sys.stderr)
        return 2
    try:
        check_name(args.benchmark)
    except ValueError as exc:
        print(f"error: --benchmark: {exc}", file=sys.stderr)
        return 2
    with Grader(workers=args.workers, timeout_s=args.timeout_s) as grader:
        r = grade_file(args.predictions, args.benchmark, args.data_dir, grader,
                       _data_files(args.data_file))
    if r.skipped:
        print(f"error: {args.benchmark}: {r.skipped}", file=sys.stderr)
        return 1
    if args.out:
        write_results([r], Path(args.out), {"predictions": str(args.predictions),
                                            **provenance(None)})
    print(f"n: {r.n}")
    print(f"accuracy: {r.accuracy:.6f}")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.predictions:
        return _grade_predictions(args)
    if not args.model:
        print("error: eval needs --model (or --predictions FILE --benchmark NAME)",
              file=sys.stderr)
        return 2
    if args.samples < 0 or (args.samples and args.temperature <= 0):
        print(f"error: --samples must be >= 0 and --temperature > 0 (got --samples "
              f"{args.samples} --temperature {args.temperature})", file=sys.stderr)
        return 2
    try:
        names = parse_names(args.benchmarks)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    files = _data_files(args.data_file)
    import torch

    from compassplay.eval.evaluator import Evaluator  # lazy: keeps the CLI start light
    from compassplay.eval.grader import Grader  # lazy: keeps the CLI start light
    from compassplay.eval.model_spec import load_eval_model  # lazy: keeps the CLI start light

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        model, tok = load_eval_model(args.model, args.tokenizer, args.dtype, device)
    except (FileNotFoundError, OSError) as exc:  # ModelNotFoundError is a FileNotFoundError
        print(f"error: --model {args.model}: {exc}", file=sys.stderr)
        return 2
    found = {n: find_data(n, args.data_dir, files) for n in names}
    if not any(path for path, _ in found.values()):  # checked before any generation
        looked = "; ".join(f"{n}: looked for {', '.join(paths) or 'nothing'}"
                           for n, (_, paths) in found.items())
        print(f"error: every benchmark would be skipped, no data file found (give --data-dir, "
              f"${DATA_DIR_ENV} or --data-file NAME=PATH): {looked}", file=sys.stderr)
        return 1
    chat = None if args.chat == "auto" else args.chat == "yes"
    with Grader(workers=args.workers, timeout_s=args.timeout_s) as grader, \
            Evaluator(model, tok, names, args.data_dir, data_files=files,
                      batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
                      limit=args.limit, grader=grader, chat=chat,
                      progress=not args.no_progress, samples=args.samples,
                      temperature=args.temperature) as ev:
        results = ev.evaluate()
        decoding = "greedy" + (f" + {args.samples} samples at temperature {args.temperature}"
                               if args.samples else "")
        meta = {"model": args.model, "decoding": decoding, "samples": args.samples,
                "temperature": args.temperature if args.samples else None,
                "chat_template": ev.chat, "max_new_tokens": args.max_new_tokens,
                "limit": args.limit, "batch_size": args.batch_size, "device": device,
                **provenance(args.dtype)}
    _print_table(results)
    if args.out:
        preds = write_results(results, Path(args.out), meta)
        print(f"results: {args.out}  predictions: {preds}")
    return 0
