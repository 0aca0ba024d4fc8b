"""`compassplay run | config show/schema/docs | bench NAME | plot | eval | report | experiment |
reference build`; `compassplay --version`.

Config errors exit with code 2 and a message naming the file and field (no traceback).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import sys
from pathlib import Path

from compassplay import __version__
from compassplay.bench.stdout_guard import stdout_to_stderr
from compassplay.config import ConfigError, dump_config, load_config
from compassplay.errors import RunError, RunInterrupted
from compassplay.executors.interrupt import EXIT_CODE

# The config `run` and `config show` use without --config (compassplay/configs/default.yaml)
DEFAULT_CONFIG = "default"
BENCHES = ("scorer", "sandbox", "generate", "step", "sync", "tasks", "pipeline", "gpu", "run",
           "cluster")


def _add_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run self-play (default: the shipped config 'default')")
    p.add_argument("--config", default=None,
                   help="YAML config file, or a shipped config by name (micro, micro_warm, "
                        "default, paper_coding_7b, ...)")
    p.add_argument("--executor", choices=["local", "ray"], default="ray",
                   help="local: one process, synchronous; ray: actors (default)")
    p.add_argument("--resume", default=None, metavar="RUN_DIR",
                   help="continue the run in RUN_DIR from its latest checkpoint")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the run in run.output_dir/run.name (by default a new run "
                        "whose directory exists goes to NAME-2, NAME-3, ...)")
    p.add_argument("--dry-run", action="store_true",
                   help="build everything the run builds except the models (config, "
                        "environment, rewards, reference and held-out sets, GPU memory plan, "
                        "resource plan), print it and exit: 0, or 2 naming the field at fault")
    p.add_argument("--gpu-memory-gib", type=float, default=None, metavar="GIB",
                   help="memory of each GPU for the memory plan (= cluster.gpu_memory_gib, "
                        "default 80; 141 for H200): --dry-run prints the plan and exits 2 "
                        "naming the field when the roles sharing a GPU do not fit")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides")


def _add_config(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="inspect configs")
    csub = p.add_subparsers(dest="config_cmd", required=True)
    show = csub.add_parser("show", help="print the resolved config as YAML (default: the "
                           "shipped config 'default', as `compassplay run` uses)")
    show.add_argument("--config", default=None, help="YAML config file or shipped config name")
    show.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    schema = csub.add_parser("schema", help="print the JSON schema of the config tree "
                             "(defaults: the built-in ones, or --config's values)")
    schema.add_argument("--config", default=None, help="YAML config file or shipped config "
                        "name whose values become the schema's defaults")
    schema.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    csub.add_parser("docs", help="print the Markdown field reference (docs/config.md)")


def _add_bench(sub: argparse._SubParsersAction, chosen: str | None) -> None:
    """Bench modules are imported only for the bench being run (they pull in torch)."""
    p = sub.add_parser("bench", help="benchmarks that print one JSON object")
    bsub = p.add_subparsers(dest="bench", required=True)
    for name in BENCHES:
        bp = bsub.add_parser(name, help=f"benchmark: {name} (--json: print one JSON object)")
        if name == chosen:
            importlib.import_module(f"compassplay.bench.{name}").add_arguments(bp)


def _add_plot(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plot", help="plot a run's metrics.jsonl to PNG")
    p.add_argument("run_dir")
    p.add_argument("--out", default=None, help="PNG path (default RUN_DIR/metrics.png)")


def _add_eval(sub: argparse._SubParsersAction) -> None:
    from compassplay.eval import commands  # lazy: keeps the CLI start light

    p = sub.add_parser("eval", help="evaluate a model on benchmarks, or grade predictions",
                       description=commands.__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    commands.add_arguments(p)


def _add_report(sub: argparse._SubParsersAction) -> None:
    from compassplay.eval import report  # lazy: keeps the CLI start light

    p = sub.add_parser("report", help="tables and plots over runs (arms, seeds, baseline)",
                       description=report.__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    report.add_arguments(p)


def _add_experiment(sub: argparse._SubParsersAction) -> None:
    from compassplay.commands import experiment  # lazy: keeps the CLI start light

    p = sub.add_parser("experiment", help="a controlled comparison: every arm x seed, then a "
                       "report", description=experiment.__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    experiment.add_arguments(p)


def _add_reference(sub: argparse._SubParsersAction) -> None:
    from compassplay.eval import reference_build  # lazy: keeps the CLI start light

    p = sub.add_parser("reference", help="reference sets")
    rsub = p.add_subparsers(dest="reference_cmd", required=True)
    b = rsub.add_parser("build", help="build a {prompt, solution} reference jsonl",
                        description=reference_build.__doc__,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    reference_build.add_arguments(b)


def package_version() -> str:
    """The installed distribution's version (package metadata), else `__version__`."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("compassplay")
    except PackageNotFoundError:
        return __version__


def build_parser(chosen_bench: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="compassplay", description=__doc__)
    parser.add_argument("--version", action="version",
                        version=f"compassplay {package_version()}")
    sub = parser.add_subparsers(dest="cmd")
    _add_run(sub)
    _add_config(sub)
    _add_bench(sub, chosen_bench)
    _add_plot(sub)
    _add_eval(sub)
    _add_report(sub)
    _add_experiment(sub)
    _add_reference(sub)
    return parser


def _run(args: argparse.Namespace) -> int:
    from compassplay.commands.launch import launch_run  # lazy: keeps the CLI start light

    config_path = args.config
    if config_path is None and args.resume:
        config_path = str(Path(args.resume) / "config.yaml")
    if config_path is None:
        config_path = DEFAULT_CONFIG
    overrides = list(args.overrides)
    if args.gpu_memory_gib is not None:
        overrides.append(f"cluster.gpu_memory_gib={args.gpu_memory_gib}")
    cfg = load_config(config_path, overrides)
    logging.getLogger().setLevel(cfg.logging.level)  # logging.level (default INFO)
    if args.dry_run:
        from compassplay.commands.dry_run import dry_run  # lazy: keeps the CLI start light

        print(json.dumps(dry_run(cfg, args.executor), indent=1))
        print(f"dry run of {config_path}: everything but the models builds")
        return 0
    if args.resume and args.overwrite:
        print("error: --resume continues a run and --overwrite replaces one: give one of them",
              file=sys.stderr)
        return 2
    run_dir = launch_run(cfg, executor=args.executor, resume=args.resume,
                         overwrite=args.overwrite)
    print(f"run finished: {run_dir}")
    print(_summary_text(run_dir))
    return 0


def _config(args: argparse.Namespace) -> int:
    """`config show` (default: DEFAULT_CONFIG, as `run`), `config schema`, `config docs`."""
    from compassplay.config import reference_docs  # lazy: keeps the CLI start light

    if args.config_cmd == "docs":
        print(reference_docs.config_markdown(), end="")
        return 0
    if args.config_cmd == "schema":
        cfg = load_config(args.config, args.overrides) if args.config or args.overrides \
            else None
        print(json.dumps(reference_docs.config_schema(cfg), indent=1))
        return 0
    print(dump_config(load_config(args.config or DEFAULT_CONFIG, args.overrides)), end="")
    return 0


def _summary_text(run_dir: Path) -> str:
    """The end-of-run table; the plot is written next to metrics.jsonl."""
    from compassplay.commands.plot import (  # lazy: keeps the CLI start light
        plot_lean_fleet,
        plot_run,
    )
    from compassplay.commands.summary import (  # lazy: keeps the CLI start light
        format_summary,
        run_summary,
    )

    try:
        plot = plot_run(run_dir)
        plot_lean_fleet(run_dir)
    except (ImportError, ValueError) as e:  # no matplotlib, no step to plot, a bad row
        logging.getLogger(__name__).warning("no plot: %s", e)
        plot = None
    summary = run_summary(run_dir)
    (Path(run_dir) / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return format_summary(summary, run_dir, plot)


def _bench(args: argparse.Namespace) -> int:
    as_json = getattr(args, "json", False)
    with stdout_to_stderr() if as_json else contextlib.nullcontext():
        mod = importlib.import_module(f"compassplay.bench.{args.bench}")
        result = mod.run(args)
    if as_json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k}: {v}")
    return getattr(mod, "exit_code", lambda _result: 0)(result)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        argv = ["run"]
    chosen = argv[1] if len(argv) > 1 and argv[0] == "bench" and argv[1] in BENCHES else None
    args = build_parser(chosen).parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        if args.cmd == "run":
            return _run(args)
        if args.cmd == "config":
            return _config(args)
        if args.cmd == "bench":
            return _bench(args)
        if args.cmd == "eval":
            from compassplay.eval import commands  # lazy: keeps the CLI start light

            return commands.run(args)
        if args.cmd == "report":
            from compassplay.eval import report  # lazy: keeps the CLI start light

            return report.run(args)
        if args.cmd == "experiment":
            from compassplay.commands import experiment  # lazy: keeps the CLI start light

            return experiment.run(args)
        if args.cmd == "reference":
            from compassplay.eval import reference_build  # lazy: keeps the CLI start light

            return reference_build.run(args)
        if args.cmd == "plot":
            from compassplay.commands.plot import (  # lazy: keeps the CLI start light
                plot_lean_fleet,
                plot_run,
            )

            print(plot_run(args.run_dir, args.out))
            fleet = plot_lean_fleet(args.run_dir)
            if fleet is not None:
                print(fleet)
            return 0
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RunInterrupted as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_CODE
    except RunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    build_parser().print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
