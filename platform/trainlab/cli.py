"""The `trainlab` command: `train` is the Hydra app; other subcommands are plain argparse."""

from __future__ import annotations

import sys

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
  bench overhead|sweep|prune|fp8|parallel|determinism|balance|checkpoint|acceptance|estimate
                         benchmarks; each prints ratios measured side by side
  submit --address URL [-m] -- [overrides...]   a trial or sweep as a Ray job on a cluster
  status|logs|stop JOB_ID --address URL         follow a submitted job
  import-spill PATH [--tracking-uri URI]        deliver the metrics a trial kept in its spill file
                         while the MLflow server was unreachable (idempotent)
"""


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        sys.exit(0 if argv else 2)
    command, rest = argv[0], argv[1:]
    from trainlab.shell_completion import hydra_argv, is_completion_call

    if is_completion_call(argv):  # Hydra's bash hook runs `trainlab -sc query=bash` at every TAB
        command, rest = "train", argv
    from trainlab.launch.ray_auth import token_mode

    token_mode()  # before anything imports ray
    if command == "train":
        from trainlab.ray_job import job_overrides

        rest = job_overrides(rest)  # a Ray job's driver writes to a durable folder, not Ray's temp dir
        sys.argv = hydra_argv(sys.argv[0], rest)  # Hydra parses sys.argv
        try:
            from trainlab import train

            train.main()
        except KeyboardInterrupt:  # before the trials took Ctrl-C over (launch.interrupt)
            from trainlab.launch.interrupt import release_cluster

            release_cluster()
            print("interrupted before training started", file=sys.stderr)
            sys.exit(130)
    elif command == "estimate":
        from trainlab.estimate.cli import main as estimate_main

        estimate_main(rest)
    elif command == "compare":
        from trainlab.compare import main as compare_main

        compare_main(rest)
    elif command == "calibrate":
        from trainlab.calibrate import main as calibrate_main

        calibrate_main(rest)
    elif command == "bench":
        from trainlab.bench import main as bench_main

        bench_main(rest)
    elif command == "import-spill":
        from trainlab.tracking.import_spill import main as import_main

        import_main(rest)
    elif command in ("submit", "status", "logs", "stop"):
        from trainlab.jobs import main as jobs_main

        jobs_main(command, rest)
    else:
        print(f"trainlab: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
