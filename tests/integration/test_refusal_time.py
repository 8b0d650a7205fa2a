"""How long `trainlab train` takes to refuse bad input, timed from the command's start (the
interpreter's start-up and the CLI's imports included), as a user waits for it.

Two paths, each named by what it imports:
- the config layer (trainlab.config.overrides.check_overrides, run before Hydra's app) refuses
  a value, a key, an option or a layout having imported Hydra and trainlab.config only: no torch,
  Ray or MLflow. That list, which no machine load changes, is what keeps it near a second; its
  CPU time is bounded as measured, and its wall time loosely (a loaded machine stretches it).
- input the config layer accepts but the trial's plan refuses (a missing data file, a damaged
  checkpoint, an unreachable Ray address) is refused after torch is imported (the plan's device
  check needs it), still before any Ray session starts: seconds of CPU, not one.

Measured on the 2-core development machine, shared (on an idle one the wall time is about the
CPU time): the config layer 0.31-0.37 s of CPU, 1.4-3.1 s wall at a load average of 18-30 and
7-11 s at 40; the plan 2.6-3.0 s of CPU, 13 s wall at 18, 33-123 s at 35-40. Idle, 2026-12-02:
the config layer 0.45-0.54 s of CPU (0.73-0.86 s while the schemas were registered twice: CI
measured over 1.0), the plan 2.8-2.9 s (a missing data file) and 5.2-5.3 s (a missing
checkpoint: 11 s, and 12.4-13.0 s in CI, while MLflow's store was opened before the checkpoint
was read).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from conftest import assert_refused, torch_import_cpu_s, trainlab_cmd

CONFIG_CPU_S = 0.6
"""CPU of a config-layer refusal, in units of importing torch here (conftest.torch_import_cpu_s):
measured 0.38 of it on two machines 2.3x apart in speed (0.5 s and 1.24 s); it imports no torch."""
PLAN_CPU_S = 6.0
"""CPU of a refusal by the trial's plan, in the same unit (measured 2.0-3.8: torch, MLflow, the
parallel layer and the memory estimate)."""
WALL_S = 30.0
"""Wall seconds of a config-layer refusal on a loaded machine (measured up to 11 at a load of
40 on 2 cores); a local Ray cluster takes longer than that to start there."""
HEAVY = ("torch", "ray", "mlflow")

# the CLI's main() in an interpreter that reports, as it exits, which heavy packages it imported
REPORTING_MAIN = ("import atexit, sys\n"
                  f"atexit.register(lambda: print('imported:', ','.join(m for m in {HEAVY!r} if m in sys.modules),"
                  " file=sys.stderr))\n"
                  "from trainlab.cli import main\n"
                  "main(sys.argv[1:])\n")


def _refuse(args: list[str], cwd: Path, *, via_main: bool = False):
    """Run `trainlab train ARGS` in `cwd`; (the process, its wall seconds, its CPU seconds, Ray
    sessions found in its RAY_TMPDIR, heavy packages it imported (via_main only))."""
    ray_tmp = cwd / "ray_tmp"
    ray_tmp.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RAY_", "HYDRA_"))}
    env |= {"RAY_TMPDIR": str(ray_tmp), "MLFLOW_TRACKING_URI": f"sqlite:///{cwd / 'mlflow.db'}"}
    cmd = ([sys.executable, "-c", REPORTING_MAIN, "train", *args] if via_main
           else trainlab_cmd("train", *args))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    imported = [line.split(": ", 1)[1] for line in proc.stderr.splitlines() if line.startswith("imported:")]
    proc.stderr = "\n".join(line for line in proc.stderr.splitlines() if not line.startswith("imported:"))
    return proc, wall, cpu, [str(p) for p in ray_tmp.rglob("session_*")], imported


README_EXAMPLE = ["model=tiny", "cluster.num_workers=2", "train.global_batch_size=16", "train.micro_batch_size=3"]
"""The README's example: a global batch that micro-batch x dp does not divide."""


def test_a_config_error_is_refused_without_importing_torch_ray_or_mlflow(tmp_path):
    proc, _, _, sessions, imported = _refuse(README_EXAMPLE, tmp_path, via_main=True)
    assert_refused(proc, ["train.global_batch_size=16", "multiple of 6"], sessions=sessions)
    assert imported == [""], f"the refusal imported {imported}: the config layer must not need them"


def test_a_config_error_is_refused_in_about_a_second_of_cpu(tmp_path):
    proc, wall, cpu, sessions, _ = _refuse(README_EXAMPLE, tmp_path)
    assert_refused(proc, ["train.global_batch_size=16", "multiple of 6"], sessions=sessions)
    unit = torch_import_cpu_s()
    assert cpu < CONFIG_CPU_S * unit, f"the refusal took {cpu:.2f} s of CPU ({wall:.1f} s wall; import torch {unit:.2f} s)"
    assert wall < WALL_S, f"the refusal took {wall:.1f} s ({cpu:.2f} s of CPU)"


def test_input_the_plan_refuses_is_refused_before_ray_in_seconds_of_cpu(tmp_path):
    """Also shows that the import report above can fail: this refusal comes after torch."""
    missing = tmp_path / "absent.bin"
    proc, wall, cpu, sessions, imported = _refuse(
        ["model=tiny", "data=tokens", f"data.path={missing}", "data.vocab_size=100"], tmp_path, via_main=True)
    assert_refused(proc, [f"data.path='{missing}'", "does not exist"], sessions=sessions)
    unit = torch_import_cpu_s()
    assert cpu < PLAN_CPU_S * unit, f"the refusal took {cpu:.2f} s of CPU ({wall:.1f} s wall; import torch {unit:.2f} s)"
    assert "torch" in imported[0].split(","), imported
