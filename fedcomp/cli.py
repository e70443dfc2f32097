"""The ``fedcomp`` command line: run, sweep, list, report, bench."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from fedcomp.platform import catalog
from fedcomp.platform.config import parse_value
from fedcomp.platform.errors import PlatformError, command_line, did_you_mean, shortened
from fedcomp.platform.progress import rounded_metric
from fedcomp.platform.signals import answering_sigterm


def _overrides(pairs: Sequence[str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise PlatformError(f"--set {pair!r}: expected section.key=value, e.g. --set algorithm.lr=0.01")
        out[key.strip()] = parse_value(value)
    return out


def cmd_run(args: argparse.Namespace) -> int:
    import fedcomp

    if args.resume:
        if args.config:
            raise PlatformError("--resume RUN_DIR continues a run with its stored config; drop the preset")
        changes = _overrides(args.set)
        if args.ray_address:
            changes["federation.ray_address"] = args.ray_address
        result = fedcomp.resume(args.resume, changes)
    else:
        overrides = _overrides(args.set)
        if args.ray_address:
            overrides["federation.ray_address"] = args.ray_address
        result = fedcomp.run(args.config or "quickstart", overrides)
    final = result.final
    metrics = {k: final[k] for k in ("round", "comm_rounds") if k in final}
    reported = catalog.tasks()[result.config.task_name].metrics
    headline = {k: rounded_metric(v) for k, v in final.items() if k in reported or k.startswith(("test_", "train_"))}
    print(f"run {result.run_dir.name} done: {metrics} {headline}")
    print(f"results: {result.run_dir}")
    from fedcomp.platform.curves import CURVES
    from fedcomp.platform.tracking import where, written

    if (result.run_dir / CURVES).is_file():
        print(f"curves: {result.run_dir / CURVES}")
    if written(result.config.run.track, result.run_dir):
        print(f"tracking: {where(result.config.run.track, result.run_dir)}")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    import fedcomp

    if args.num_samples is not None and args.num_samples < 1:
        raise PlatformError(f"--num-samples = {args.num_samples}: must be >= 1")
    if args.seeds is not None and args.seeds < 1:
        raise PlatformError(f"--seeds = {args.seeds}: must be >= 1")
    if args.max_concurrent is not None and args.max_concurrent < 1:
        raise PlatformError(f"--max-concurrent = {args.max_concurrent}: must be >= 1")
    if args.resume:
        given = [name for name, value in (
            ("the spec", args.spec), ("--set", args.set), ("--search", args.search), ("--num-samples", args.num_samples),
            ("--seeds", args.seeds), ("--scheduler", args.scheduler), ("--pack", args.pack),
            ("--extend-edges", args.extend_edges), ("--edge-cap", args.edge_cap),
            ("--max-concurrent", args.max_concurrent)) if value is not None and value is not False and value != []]
        if given:
            raise PlatformError(f"--resume SWEEP_DIR continues a sweep with its stored spec; drop {', '.join(given)} "
                                f"(--ray-address and --verbose may stay)")
        result = fedcomp.resume_sweep(args.resume, ray_address=args.ray_address, verbose=args.verbose)
    else:
        result = fedcomp.sweep(
            args.spec or "quick", search=args.search, num_samples=args.num_samples, seeds=args.seeds,
            scheduler=args.scheduler, max_concurrent=args.max_concurrent, pack=args.pack, overrides=_overrides(args.set),
            ray_address=args.ray_address, verbose=args.verbose, extend_edges=args.extend_edges, edge_cap=args.edge_cap,
        )
    from fedcomp.sweeps.report import (
        best_and_edges,
        edge_warnings,
        extension_summary,
        markdown,
        outcome_counts,
        sweep_report,
    )

    print(markdown(result.trials, result.spec, warnings=False))
    for line in edge_warnings(best_and_edges(result.trials, result.spec)[1]):
        print(line)
    for line in extension_summary(result.path):
        print(line)
    png, md = sweep_report(result)
    print(f"sweep {result.path.name}: {outcome_counts(result.trials, result.spec)}")
    print(f"results: {result.path / 'trials.parquet'}\nplot: {png}\ntable: {md}")
    from fedcomp.platform.tracking import where

    track = result.spec.base_config().run.track
    if where(track, result.path, sweep=True):
        print(f"tracking: {where(track, result.path, sweep=True)}")
    return 1 if (result.trials["status"] == "error").any() else 0


def cmd_verify(args: argparse.Namespace) -> int:
    from fedcomp.verification import verify

    overrides = _overrides(args.set)
    if args.ray_address:
        overrides["federation.ray_address"] = args.ray_address
    outcome = verify(args.run_dir, backend=args.backend, overrides=overrides, out=args.out, progress=args.progress)
    print(outcome.report())
    return 0 if outcome.identical else 1


def cmd_check(args: argparse.Namespace) -> int:
    from fedcomp.conformance import check

    outcome = check(args.config or "quickstart", _overrides(args.set), ray=not args.no_ray)
    print(outcome.report())
    return 0 if outcome.identical else 1


def cmd_list(args: argparse.Namespace) -> int:
    from fedcomp.platform.catalog import algorithms, tasks
    from fedcomp.platform.config import import_user_module, preset_description, preset_names
    from fedcomp.platform.kinds import KIND_DESCRIPTIONS

    for module in args.module or []:
        import_user_module(module, f"--module {module!r}")
    if args.name:
        return _list_one(args.name)
    print("algorithms:")
    for name, algorithm in sorted(algorithms().items()):
        print(f"  {name:<26} [{algorithm.kind}] {algorithm.description}")
    print("tasks:")
    for name, task in sorted(tasks().items()):
        print(f"  {name:<26} [{', '.join(sorted(task.kinds))}] {task.description}")
    print("presets:")
    for name in preset_names():
        print(f"  {name:<26} {preset_description(name)}")
    from fedcomp.sweeps import spec as sweeps

    print("sweep presets:")
    for name in sweeps.preset_names():
        print(f"  {name:<26} {sweeps.preset_description(name)}")
    print("problem kinds:")
    for name, text in KIND_DESCRIPTIONS.items():
        print(f"  {name:<26} {text}")
    return 0


def _list_one(name: str) -> int:
    """``fedcomp list NAME``: an algorithm's hyperparameters, a task's parameters and metrics, a config section's
    settings -- each field's type, bounds, default and description -- or a preset's file."""
    from fedcomp.platform.catalog import algorithms, tasks
    from fedcomp.platform.config import SECTION_MODELS, preset_names, preset_text
    from fedcomp.platform.params import field_lines
    from fedcomp.sweeps import spec as sweeps

    shown = []
    if name in algorithms():
        algorithm = algorithms()[name]
        shown += [f"algorithm {name} [{algorithm.kind}]: {algorithm.description}", "  hyperparameters (algorithm.KEY):",
                  *(f"    {line}" for line in field_lines(algorithm.HParams))]
    if name in tasks():
        task = tasks()[name]
        shown += [f"task {name} [{', '.join(sorted(task.kinds))}]: {task.description}",
                  f"  metrics: {', '.join(task.metrics)} (headline {task.metrics[0]}, better {task.mode})",
                  "  parameters (task.KEY):", *(f"    {line}" for line in field_lines(task.Params))]
    if name in SECTION_MODELS:
        shown += [f"section {name} ({name}.KEY):", *(f"    {line}" for line in field_lines(SECTION_MODELS[name]))]
    if name in preset_names():
        shown += [f"preset {name}:", *(f"    {line}" for line in preset_text(name).splitlines())]
    if name in sweeps.preset_names():
        shown += [f"sweep preset {name}:", *(f"    {line}" for line in sweeps.preset_text(name).splitlines())]
    if not shown:
        raise PlatformError(f"list {name!r}: not an algorithm, task, config section or preset; `fedcomp list` names them "
                            f"(a task or algorithm of your own: --module FILE)")
    print("\n".join(shown))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from fedcomp.api import report

    png, md = report(args.results_dir, metric=args.metric, x=args.x, out=args.out)
    print(md.read_text())
    print(f"plot: {png}\ntable: {md}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from fedcomp.bench import main as bench_main

    args.overrides = _overrides(args.set)
    return bench_main(args)


class _Parser(argparse.ArgumentParser):
    """argparse with a bad flag reported as one line (naming the flag, the value and what is allowed), like
    every other bad input, instead of the usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"fedcomp: error: {message} (see `{self.prog} --help`)\n")

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        """A value outside a flag's (or the subcommands') choices says the nearest choice, as a misspelt preset
        or config key does (``fedcomp swep``: did you mean 'sweep'?), before the choices."""
        if action.choices is not None and value not in action.choices:
            choices = ", ".join(map(repr, action.choices))
            raise argparse.ArgumentError(action, f"invalid choice: {value!r}"
                                                 f"{did_you_mean(value, map(str, action.choices))} (choose from {choices})")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fedcomp", description="Federated nested stochastic optimisation on Ray.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{run,verify,check,list,sweep,report,bench}")

    run = sub.add_parser("run", help="run one experiment (default preset: quickstart)")
    run.add_argument("config", nargs="?", help="preset name or YAML file (see `fedcomp list`)")
    run.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override a config value")
    run.add_argument("--resume", metavar="RUN_DIR", help="continue an interrupted run from its last checkpoint")
    run.add_argument("--ray-address", metavar="ADDR", help="join this Ray cluster (default: $RAY_ADDRESS, else local)")
    run.set_defaults(func=cmd_run)

    ver = sub.add_parser(
        "verify", help="re-run a finished run from its run.json and check every metric is bit-identical",
        description="Re-run the finished run in RUN_DIR from its recorded config (in a temporary folder, or under "
                    "--out) and compare every metric column with its metrics.parquet bit for bit; also compare the "
                    "recorded environments. Exit 0 if identical, 1 if not, 2 on bad input.",
    )
    ver.add_argument("run_dir", metavar="RUN_DIR")
    ver.add_argument("--backend", choices=["local", "ray"], help="re-run on this backend (default: the run's own)")
    ver.add_argument("--set", action="append", default=[], metavar="federation.KEY=VALUE",
                     help="change where clients run, e.g. federation.clients_per_actor=2 (nothing that changes numbers)")
    ver.add_argument("--out", help="keep the re-run under this folder (default: a temporary folder, removed)")
    ver.add_argument("--ray-address", metavar="ADDR", help="join this Ray cluster (default: $RAY_ADDRESS, else local)")
    ver.add_argument("--progress", choices=["auto", "bar", "log", "none"],
                     help="the re-run's progress output (default: the run's own run.progress)")
    ver.set_defaults(func=cmd_verify)

    chk = sub.add_parser(
        "check", help="run a config again locally, on Ray packed two ways and stopped-and-resumed: all bit-identical?",
        description="What fedcomp promises of every algorithm and task, checked on CONFIG (your own above all): its "
                    "run again with the same seed, on Ray packed as configured and otherwise, and stopped at its middle "
                    "and resumed, each compared with the first run bit for bit. Exit 0 if all are identical, 1 if "
                    "not, 2 on bad input.",
    )
    chk.add_argument("config", nargs="?", help="preset name or YAML file (default: quickstart)")
    chk.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override a config value")
    chk.add_argument("--no-ray", action="store_true", help="leave out the Ray runs")
    chk.set_defaults(func=cmd_check)

    ls = sub.add_parser("list", help="list algorithms, tasks and presets; with a NAME, its parameters")
    ls.add_argument("name", nargs="?", help="an algorithm, task, config section (federation, run) or preset: its "
                    "parameters' types, bounds, defaults and descriptions, or the preset's file")
    ls.add_argument("--module", action="append", metavar="FILE", help="import your module first (a .py file or a "
                    "dotted name; repeatable), so that its algorithms and tasks are listed too")
    ls.set_defaults(func=cmd_list)

    sw = sub.add_parser("sweep", help="Ray Tune sweep of whole runs (default preset: quick)")
    sw.add_argument("spec", nargs="?", help="sweep preset or YAML file (see `fedcomp list`)")
    sw.add_argument("--search", choices=["grid", "optuna"], help="grid search (default) or Optuna's TPE")
    sw.add_argument("--num-samples", type=int, help="Optuna: configurations to try")
    sw.add_argument("--seeds", type=int, help="repeats of every configuration (seeds run.seed, run.seed+1, ...)")
    sw.add_argument("--scheduler", choices=["none", "asha"], help="stop weak trials early (ASHA, on rounds)")
    sw.add_argument("--max-concurrent", type=int, help="trials running at once (default: as many as fit)")
    sw.add_argument("--pack", choices=["none", "sequential", "lockstep"],
                    help="grid configurations per trial: one, several one at a time, or several in lockstep (vmapped)")
    sw.add_argument("--extend-edges", action="store_true",
                    help="grid search: after the grid, run the next grid value past each group's edge optimum "
                         "(the axis' ratio or step, else x sqrt(10); clamped to the bound) until it is interior, "
                         "--edge-cap extensions per axis or the bound; the report lists what moved and what remains")
    sw.add_argument("--edge-cap", type=int, metavar="N", help="with --extend-edges: extensions per axis and group (default 3)")
    sw.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override the base config")
    sw.add_argument("--resume", metavar="SWEEP_DIR", help="continue an interrupted sweep")
    sw.add_argument("--ray-address", metavar="ADDR", help="join this Ray cluster (default: $RAY_ADDRESS, else local)")
    sw.add_argument("--verbose", type=int, default=1, choices=[0, 1, 2], help="Tune's progress output")
    sw.set_defaults(func=cmd_sweep)

    rep = sub.add_parser("report", help="plot and tabulate the runs or the sweep under a results folder")
    rep.add_argument("results_dir")
    rep.add_argument("--metric", help="default: each run's task headline metric (test_accuracy, x_dist_sq, ...); "
                                       "the sweep's metric for sweeps")
    rep.add_argument("--x", default="comm_rounds", help="x axis column (comm_rounds, local_steps, samples, wall_time)")
    rep.add_argument("--out", help="where to write report.png / report.md (default: RESULTS_DIR)")
    rep.set_defaults(func=cmd_report)

    bench = sub.add_parser(
        "bench", help="time the Ray and local backends against a plain PyTorch loop",
        description="Time fedcomp's Ray and local backends against a plain PyTorch loop in this process. The "
                    "side-by-side benchmark against pfl and Flower is `python benchmarks/peers.py` in a source checkout.",
    )
    bench.add_argument("--clients", type=int, nargs="+", help="registered clients (default: 100 1000)")
    bench.add_argument("--cohort", type=int, help="clients per round (default: 10)")
    bench.add_argument("--rounds", type=int, help="rounds (default: 20)")
    bench.add_argument("--local-steps", type=int, help="local SGD steps per client and round (default: 5)")
    bench.add_argument("--repeats", type=int, help="runs per configuration (default: 3)")
    bench.add_argument("--markdown", action="store_true", help="print the table as markdown")
    bench.add_argument("--hidden", type=int, nargs="+", help="MLP hidden layer widths (default: 64)")
    bench.add_argument("--set", action="append", default=[], metavar="federation.KEY=VALUE",
                       help="a federation option for fedcomp's runners, e.g. federation.torch_compile=true or "
                            "federation.server=actor (the plain loop and torch.optim, the references, stay as they are)")
    bench.add_argument("--runners", nargs="+", choices=["ray", "local", "plain", "optim"],
                       help="which runners to time (default: ray local plain; optim: torch.optim.SGD in place)")
    # moved to benchmarks/peers.py: `--peers [FLAGS]` names the command to run instead (exit 2)
    bench.add_argument("--peers", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    bench.set_defaults(func=cmd_bench)
    return parser


OUT_OF_MEMORY = re.compile(r"can't allocate memory|out of memory|Cannot allocate memory", re.IGNORECASE)
"""How torch's allocators (CPU and CUDA) say that an allocation failed."""
MESSAGE_LIMIT = 2000
"""The most characters of an error's message the command line prints: a message names the value it rejects, and a
value can be huge (a YAML file's aliases expand a few lines into millions of items)."""


def one_line(error: BaseException) -> str:
    """The error's message on one line (a message is one line by contract; this keeps it so if a library's
    text slipped into one), cut to :data:`MESSAGE_LIMIT` characters."""
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= MESSAGE_LIMIT else f"{text[:MESSAGE_LIMIT]} ... ({len(text):,} characters in all)"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with command_line(), answering_sigterm() if argv is None else contextlib.nullcontext():  # not a caller's
            code: int = args.func(args)
        return code
    except PlatformError as error:
        print(f"fedcomp: error: {one_line(error)}", file=sys.stderr)
        return error.exit_code
    except (MemoryError, RuntimeError) as error:  # a size too large for the machine, whichever field it was
        if not isinstance(error, MemoryError) and not OUT_OF_MEMORY.search(str(error)):
            raise
        print(f"fedcomp: error: out of memory ({type(error).__name__}: {shortened(one_line(error), 200)}): a size in the config is "
              f"too large for this machine (federation.clients, a batch size, the task's or model's dimensions)",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt as error:  # a run's Interrupted says what it kept and how to continue
        print(f"fedcomp: interrupted{': ' + one_line(error) if str(error) else ''}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `fedcomp list | head`: the reader stopped reading; quietly, as a shell's command would
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (Python's flush at exit must not fail)
        return 141  # 128 + SIGPIPE
    finally:
        if argv is None:
            leave_ray()


def leave_ray() -> None:
    """End this process's Ray session (stop the local Ray it started, or leave the cluster it joined) where the
    command used one. Ray's own exit hook does the same but first sleeps half a second for late worker output, and
    a command's workers have all ended by then."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
