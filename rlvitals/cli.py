"""The `rlvitals` command: train, eval, runs, doctor, presets, report, export, dashboards, stack.

Every user error is one line on stderr naming the bad value and what would be
accepted, with exit code 2 and nothing written.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

from .config import ConfigError, TrainConfig, build_config, coerce
from .train_parser import add_train_parser

EXIT_USAGE = 2


class UsageError(Exception):
    """Bad input from the user; printed as one line, exit code 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not usage + message
        raise UsageError(message)


def build_parser() -> Parser:
    parser = Parser(prog="rlvitals", description="Actor-learner RL that tells you where it hurts.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    add_train_parser(sub)

    ev = sub.add_parser("eval", help="run a trained policy and print its return statistics as JSON")
    ev.add_argument("--run-dir", help="directory of a finished or running run (not needed for a checkpoint path)")
    ev.add_argument("--checkpoint", default="latest", metavar="PATH_OR_NAME",
                    help="latest (default), best or update-<N> of --run-dir, or a path to a checkpoint file")
    ev.add_argument("--episodes", type=int, default=10, help="episodes to run (> 0)")
    acting = ev.add_mutually_exclusive_group()
    acting.add_argument("--sample", action="store_true", help="sample actions from the policy instead of acting "
                                                              "greedily (the most likely action, the Gaussian's mean)")
    acting.add_argument("--greedy", action="store_true", help="act greedily: the default, accepted for older scripts")
    ev.add_argument("--seed", type=int, default=12345, help="seed of the evaluation envs")
    ev.add_argument("--env", metavar="MODULE:ENV_ID",
                    help="the env the checkpoint was trained on, where it is module:EnvId: naming it allows importing "
                         "that module (a checkpoint is data and never makes rlvitals import code by itself)")

    runs = sub.add_parser("runs", help="list the runs under a directory as a table")
    runs.add_argument("directory", help="directory holding run directories (searched recursively)")
    runs.add_argument("--sort", default="-final_return", metavar="KEY",
                      help="column or config field to sort by (e.g. -gamma); prefix with - for descending; runs "
                           "without a value come last (default -final_return)")
    runs.add_argument("--filter", action="append", default=[], metavar="KEY=VALUE",
                      help="keep runs whose column or config field equals VALUE, compared as the field's type "
                           "(learning_rate=1e-3 finds 0.001, sync=yes finds true, hidden_sizes=64,64); FIELD.KEY "
                           "reaches inside a mapping field (env_kwargs.g=9.81); repeatable")
    runs.add_argument("--top", type=int, default=0, help="show only the first N rows")
    runs.add_argument("--json", action="store_true", help="print JSON rows instead of a table")

    doctor = sub.add_parser("doctor", help="run the probe ladder and name the broken component from the whole "
                                           "pass/fail pattern (exit 0 healthy, 1 findings, 2 bad input)")
    doctor.add_argument("--seed", type=int, default=0, help="seed of every probe run (>= 0)")
    doctor.add_argument("--keep", metavar="DIR",
                        help="keep the probe runs under DIR (new or empty) instead of a temp dir")
    doctor.add_argument("--config", metavar="FILE",
                        help="YAML file as `train --config` takes: run the ladder with its learning settings too and "
                             "report where they and the reference settings differ")
    doctor.add_argument("--ray", action="store_true",
                        help="also run probe 5 with one Ray actor, asynchronous (weights must follow the learner) and "
                             "synchronous (must replay local mode)")
    doctor.add_argument("--env", metavar="ENV",
                        help="check this env (gymnasium id or module:EnvId) with the random and fixed probe agents "
                             "instead of running the ladder (add --config to run the ladder too)")
    doctor.add_argument("--env-kwargs", metavar="MAPPING",
                        help="with --env: keyword arguments for its constructor, a JSON or YAML mapping "
                             "(default: the --config file's env_kwargs when it trains the same env)")
    doctor.add_argument("--max-episode-steps", type=int, metavar="N",
                        help="with --env: steps within which every episode must end (default: the env's time limit, "
                             "else 10000)")
    doctor.add_argument("--step-timeout", type=float, metavar="SECONDS",
                        help="with --env: seconds one env step may take before the check reports the env blocked "
                             "and ends (default 30)")
    doctor.add_argument("--recurrent-size", type=int, metavar="N",
                        help="also train the memory probe (a cue to recall 4 steps later) with a recurrent policy of "
                             "N units; default: the --config's recurrent_size (0: no memory probe)")
    doctor.add_argument("--json", action="store_true",
                        help="print only the findings, as a JSON list of verdicts (rule, severity, component, "
                             "first_seconds, first_update, message)")

    report = sub.add_parser("report", help="write one offline HTML page of one or more runs (overlaid)")
    report.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (running, crashed or done)")
    report.add_argument("-o", "--output", metavar="FILE",
                        help="HTML file to write (default: RUN_DIR/report.html for one run, ./report.html for several)")

    presets = sub.add_parser("presets", help="list the presets of settings per env family (train --preset NAME), or "
                                             "show one's every field with its value and source")
    presets.add_argument("name", nargs="?", metavar="NAME",
                         help="the preset to show, as a config file: field: value, its source as a comment")

    export = sub.add_parser("export", help="write a run's metrics in another tool's format")
    export.add_argument("format", choices=["tensorboard"], help="tensorboard: event files in the run directory")
    export.add_argument("run_dir", metavar="RUN_DIR", help="run directory with a metrics.jsonl")

    from . import dashboards_cli, stack

    dashboards_cli.add_parser(sub)
    stack.add_parser(sub)
    return parser


def train_config_from_args(args: argparse.Namespace) -> TrainConfig:
    overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)
                 if getattr(args, f.name) is not None}
    if "verbosity" not in overrides and os.environ.get("RLVITALS_VERBOSITY"):
        overrides["verbosity"] = os.environ["RLVITALS_VERBOSITY"]
    if args.config:
        from .config import load_yaml

        file_values = load_yaml(args.config)
        if "verbosity" in file_values and "verbosity" in overrides and args.verbosity is None:
            overrides.pop("verbosity")  # the file beats the environment variable
    return build_config(args.config, overrides)


def preflight(cfg: TrainConfig, fresh_dir: bool = True) -> None:
    """Everything that can be checked before anything is written, cheapest first: a wrong path, port or
    address is answered before the env is built or torch is imported (seconds on a small machine)."""
    from .validate import check_metrics_address, check_ray_address, check_run_dir_creatable

    if fresh_dir:
        check_run_dir_creatable(cfg.run_dir)
    if cfg.verbosity != "off":
        check_metrics_address(cfg.metrics_host, cfg.metrics_port)
    if cfg.mode == "ray":
        check_ray_address(cfg.address)

    from .env_preflight import atari_options, check_env_usable
    from .limits import check_memory

    obs_space, action_space = check_env_usable(cfg, atari_options(cfg))  # built, reset and stepped once
    check_memory(cfg, obs_space, action_space)
    from .parts import resolve_device  # torch: only once the env and the sizes are known to be usable

    try:
        resolve_device(cfg)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if cfg.mode == "ray":
        from .distributed import preflight_ray
        from .validate import check_private_ray_fits

        check_private_ray_fits(cfg)
        preflight_ray(cfg)


def resume_config(args: argparse.Namespace) -> tuple[TrainConfig, dict]:
    """The config of the run being resumed, with the few overrides that keep it the same run."""
    from .archive import RunArchive
    from .archive.files import refuse_links
    from .checkpoint import RESUMABLE_FIELDS, check_resumable
    from .validate import check_checkpoint_content

    path = Path(args.resume)
    if not (path / "config.yaml").is_file():
        raise ConfigError(f"resume={args.resume!r} is invalid: no config.yaml there; expected a run directory")
    refuse_links(path)  # a resume appends, truncates and replaces files: never through a link
    if not os.path.lexists(path / "checkpoints" / "latest.pt"):
        raise ConfigError(f"resume={args.resume!r} is invalid: the run ended before its first checkpoint, so there "
                          f"is nothing to resume{_cleaned(path)}; expected a run directory with "
                          "checkpoints/latest.pt (start a new run instead)")
    try:
        state = RunArchive(path).load_checkpoint()
        check_checkpoint_content(path / "checkpoints" / "latest.pt", state)
        check_resumable(path, state)  # not busy, the run's own checkpoint, fits the env as it is now
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)
                 if getattr(args, f.name) is not None}
    saved = {k: v for k, v in state["config"].items()}
    for name, raw in overrides.items():
        run_has = coerce(name, saved.get(name, getattr(TrainConfig(), name)))
        if name not in RESUMABLE_FIELDS and coerce(name, raw) != run_has:  # repeating the run's value is fine
            raise ConfigError(f"{name} cannot change when resuming (the run has {name}={run_has!r}; another value "
                              f"would make it a different run); changeable: {', '.join(sorted(RESUMABLE_FIELDS))}")
    saved.update(overrides)
    saved["run_dir"] = str(path)
    return build_config(None, saved), state


def _cleaned(path: Path) -> str:
    """Remove what a run killed before its first checkpoint left (its discovery files: targets Prometheus shows
    down for ever; temporaries), holding its lock; the words saying so, for the refusal's line."""
    from .archive import RunArchive

    archive = RunArchive(path)
    archive.lock()  # RunDirBusy when the run is in fact alive
    try:
        removed = archive.remove_leftovers()
    finally:
        archive.close()
    return f" (removed what its dead processes left: {', '.join(removed)})" if removed else ""


def cmd_train(args: argparse.Namespace) -> int:
    from .archive import default_run_dir
    from .signals import report_stop

    if args.resume:
        if args.config:
            raise ConfigError("--config cannot be combined with --resume: the run keeps its own config")
        cfg, state = resume_config(args)
        if cfg.total_env_steps <= state["tracker"]["env_steps"]:
            raise ConfigError(f"total_env_steps={cfg.total_env_steps} is invalid: the run already has "
                              f"{state['tracker']['env_steps']} env steps; pass a larger --total-env-steps")
        preflight(cfg, fresh_dir=False)
        from .report.tensorboard import observers_for
        from .session import run_training

        summary = run_training(cfg, sys.argv[1:], resume=state, observers=observers_for(cfg, cfg.run_dir))
        print(json.dumps(summary))
        _human_summary(cfg, summary)
        return report_stop(summary)
    cfg = train_config_from_args(args)
    if not cfg.run_dir:
        cfg.run_dir = default_run_dir(cfg.env, cfg.seed)
    preflight(cfg)
    if not args.preset and not args.config:  # the defaults were chosen by no one: say which preset fits the env
        from .presets import family_hint

        hint = family_hint(cfg.env)
        if hint:
            print(f"rlvitals: {hint}", file=sys.stderr, flush=True)
    from .report.tensorboard import observers_for
    from .session import run_training

    summary = run_training(cfg, sys.argv[1:], observers=observers_for(cfg, cfg.run_dir))
    print(json.dumps(summary))
    _human_summary(cfg, summary)
    return report_stop(summary)


def _human_summary(cfg: TrainConfig, summary: dict) -> None:
    """The run's few lines for a person, on stderr (stdout's last line stays the JSON summary)."""
    if cfg.progress:
        from .report import format_run_summary

        print(format_run_summary(summary, cfg.run_dir), file=sys.stderr, flush=True)


def cmd_eval(args: argparse.Namespace) -> int:
    from .limits import EVAL_EPISODES_MAX
    from .validate import check_seed_flag

    if not 0 < args.episodes <= EVAL_EPISODES_MAX:
        raise UsageError(f"--episodes={args.episodes} is invalid: expected an integer from 1 to {EVAL_EPISODES_MAX}")
    check_seed_flag("--seed", args.seed)
    from .archive import resolve_checkpoint

    try:
        resolve_checkpoint(args.run_dir, args.checkpoint)   # a wrong name or path is said before torch loads
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    from .evaluate import evaluate_run

    try:
        result = evaluate_run(args.run_dir, args.episodes, greedy=not args.sample, seed=args.seed,
                              checkpoint=args.checkpoint, env=args.env)
    except (ValueError, OSError) as exc:
        raise UsageError(str(exc)) from None
    print(json.dumps(result))
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    from .runs import list_runs

    try:
        table = list_runs(args.directory, sort=args.sort, filters=args.filter, top=args.top, as_json=args.json)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(table)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from .report import ReportError, build_report

    try:
        path, size = build_report(args.run_dirs, args.output)
    except ReportError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:  # e.g. an -o path where nothing can be written
        raise UsageError(_unusable(exc, args.output)) from None
    print(json.dumps({"report": str(path), "bytes": size}))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from .report import ReportError
    from .report.tensorboard import export_tensorboard
    from .signals import RunStopped, signals_raise

    try:
        with signals_raise():  # a stop mid-way removes the partial export before the process ends
            path, rows = export_tensorboard(args.run_dir)
    except RunStopped as exc:
        print(f"rlvitals: {exc.status} ({exc.reason}): export stopped; its partial event file removed, the run's "
              f"files as they were in {args.run_dir}", file=sys.stderr, flush=True)
        return exc.exit_code
    except ReportError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:  # as cmd_report: a run directory that cannot be read or listed
        raise UsageError(_unusable(exc, args.run_dir)) from None
    print(json.dumps({"tensorboard": str(path), "rows": rows}))
    return 0


def _unusable(exc: OSError, given: str | None) -> str:
    """One line for an OSError of report or export: the path the error names (else the one given), and why."""
    where = exc.filename or given
    where = f"{str(where)!r} is unusable" if where is not None else "a file of the run is unusable"
    return (f"{where} ({exc.strerror or exc}); expected readable run directories and a writable place for "
            "what is written")


def cmd_presets(args: argparse.Namespace) -> int:
    from .presets import listing, show

    print(show(args.name) if args.name is not None else listing())  # a bad name: ConfigError, one line, exit 2
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from .validate import check_seed_flag

    check_seed_flag("--seed", args.seed)   # before the doctor's imports (torch): a bad flag is said at once
    from .doctor.command import run_command

    return run_command(args)


def cmd_dashboards(args: argparse.Namespace) -> int:
    from .dashboards_cli import run

    return run(args)


def cmd_stack(args: argparse.Namespace) -> int:
    from .stack import run

    return run(args)


COMMANDS = {"train": cmd_train, "eval": cmd_eval, "runs": cmd_runs, "doctor": cmd_doctor,
            "dashboards": cmd_dashboards, "stack": cmd_stack, "report": cmd_report, "export": cmd_export,
            "presets": cmd_presets}


def main(argv: list[str] | None = None) -> int:
    import logging

    from rlvitals.actors.envs import EnvError  # light: no torch

    from .signals import RunStopped, report_abort

    logging.basicConfig(level=logging.WARNING, format="rlvitals: %(message)s")
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    # `--sort -final_return` would read as an unknown option: bind the value to its flag.
    argv = [f"{a}={argv[i + 1]}" if a == "--sort" and i + 1 < len(argv) else a for i, a in enumerate(argv)
            if not (i > 0 and argv[i - 1] == "--sort")]
    try:
        args = parser.parse_args(argv)
        return COMMANDS[args.command](args)
    except (UsageError, ConfigError, EnvError) as exc:
        print(f"rlvitals: error: {' '.join(str(exc).split())}", file=sys.stderr)  # one line, whatever it quotes
        return EXIT_USAGE
    except (KeyboardInterrupt, RunStopped) as exc:  # says only what was written (rlvitals/signals.py)
        return report_abort(exc)
    except Exception as exc:
        runtime = tuple(getattr(sys.modules[m], n) for m, n in (("rlvitals.actors.runner", "EnvStepError"),
                                                                ("rlvitals.guard", "NonFiniteError"),
                                                                ("rlvitals.archive", "ArchiveWriteError"))
                        if m in sys.modules)
        if runtime and isinstance(exc, runtime):
            print(f"rlvitals: error: {exc}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
