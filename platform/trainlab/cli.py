"""The `trainlab` command: `train` is the Hydra app; other subcommands are plain argparse."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Callable

from trainlab.ray_job import job_overrides
from trainlab.shell_completion import hydra_argv, is_completion_call

USAGE = """usage: trainlab <command> [args]

commands:
  train [overrides...]   run a trial (Hydra app: `trainlab train model=tiny precision=bf16`,
                         `trainlab train --help` lists groups and options)
  train -m [sweeps...]   a Hydra multirun: every job a Ray trial, a parent MLflow run
                         (`trainlab train -m precision=fp32,fp16 seed=0,1`, `-m +sweep=NAME`)
  estimate [-m] [overrides...]   memory per rank, step time, tokens/s, MFU and bound of a trial
                         or a sweep's trials, before anything runs (cluster.nodes=[8xH100,...],
                         a running Ray cluster at cluster.address, or this machine)
  compare --sweep NAME   a sweep's trials side by side: table, plots, report.html
  calibrate [-o PATH]    fit the estimate to a store's finished trials (--tracking-uri, --experiment,
                         --sweep); writes the JSON cluster.calibration=PATH reads
  bench overhead|hf|sweep|study|prune|fp8|parallel|determinism|balance|checkpoint|acceptance|estimate
                         benchmarks; each prints ratios measured side by side
  submit --address URL [-m] -- [overrides...]   a trial or sweep as a Ray job on a cluster
  status|logs|stop JOB_ID --address URL         follow a submitted job
  import-spill PATH [--tracking-uri URI]        deliver the metrics a trial kept in its spill file
                         while the MLflow server was unreachable (idempotent)
  hf-demo DIR            a tiny local Hugging Face model, tokenizer and dataset to try model=hf
                         and data=hf on (nothing downloads)
"""


def _train(_command: str, rest: list[str]) -> None:
    rest = job_overrides(rest)  # a Ray job's driver writes to a durable folder, not Ray's temp dir
    sys.argv = hydra_argv(sys.argv[0], rest, commands=list(COMMANDS))  # Hydra parses sys.argv
    from trainlab.launch import interrupt

    interrupt.stop_before_start()  # SIGTERM, SIGHUP: a line and 128 + n, as Ctrl-C's KeyboardInterrupt
    try:
        from trainlab import train

        train.main()
    except KeyboardInterrupt:  # before the trials took Ctrl-C over (launch.interrupt)
        interrupt.release_cluster()
        print(interrupt.after_interrupt(), file=sys.stderr)
        sys.exit(130)
    except interrupt.StopBeforeStart as stop:
        interrupt.release_cluster()
        print(interrupt.stopped_line(stop.signum), file=sys.stderr)
        sys.exit(128 + stop.signum)


def _entry(module: str, *, with_command: bool = False) -> Callable[[str, list[str]], None]:
    """A subcommand whose `main(rest)` (or `main(command, rest)`) lives in `module`, imported
    only when it runs: `trainlab compare` must not pay for Ray, nor a TAB for anything."""
    def run(command: str, rest: list[str]) -> None:
        entry = importlib.import_module(module).main
        entry(command, rest) if with_command else entry(rest)

    return run


COMMANDS: dict[str, Callable[[str, list[str]], None]] = {
    "train": _train,
    "estimate": _entry("trainlab.estimate_command"),
    "compare": _entry("trainlab.compare"),
    "calibrate": _entry("trainlab.calibrate"),
    "bench": _entry("trainlab.bench"),
    "submit": _entry("trainlab.jobs", with_command=True),
    "status": _entry("trainlab.jobs", with_command=True),
    "logs": _entry("trainlab.jobs", with_command=True),
    "stop": _entry("trainlab.jobs", with_command=True),
    "import-spill": _entry("trainlab.tracking.import_spill"),
    "hf-demo": _entry("trainlab.hf_demo_command"),
}
"""Every subcommand, in the order completion offers them (their names go to shell_completion)."""


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        sys.exit(0 if argv else 2)
    command, rest = argv[0], argv[1:]
    if is_completion_call(argv):  # Hydra's bash hook runs `trainlab -sc query=bash` at every TAB
        command, rest = "train", argv
    if command not in COMMANDS:
        print(f"trainlab: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
        sys.exit(2)
    try:  # every command resolves paths against it (Hydra first): say so once, not in a traceback
        os.getcwd()
    except FileNotFoundError:
        was = os.environ.get("PWD", "")
        print(f"error: the working directory{f' {was!r}' if was else ''} no longer exists (deleted or moved "
              "after the shell entered it); cd to a folder that exists and run the command again",
              file=sys.stderr)
        sys.exit(2)
    from trainlab.launch.ray_auth import token_mode

    token_mode()  # before anything imports ray
    COMMANDS[command](command, rest)


if __name__ == "__main__":
    main()
