"""The GPU acceptance run: what a first run on a GPU must show, in one command.

    bash .ci/gpu-accept                       # GPU machine: installs the carried wheels, then this
    python -m trainlab.bench.acceptance       # wherever Hydra and torchao are installed
    python -m trainlab.bench.acceptance --device cpu --quick --without ray,mlflow   # the plumbing, on a CPU

Parts (--parts), each in processes of its own, so one that fails or hangs hides nothing else:
  env       device, capability, memory, versions, which of Ray/MLflow/Hydra/torchao import;
            bare matmul TFLOP/s per dtype, measured here (they size the plan)
  table     every precision mode trains the same model on the same tokens from the same init,
            one `torchrun --nproc-per-node 1` process per mode (trainlab.bench.fp8): tokens/s,
            MFU, validation loss, peak memory. The model is the largest preset that fits; the
            steps are as many as fit the time budget (acceptance_plan), printed before it starts
  overhead  the engine against a bare PyTorch loop (trainlab.bench.overhead, tracking=none)
  tests     pytest tests/gpu -m gpu
Ends with the table, issue 15's targets (pass / FAIL on a GPU) and, last, `fp8/bf16: X.XXx`
(fp8_tensorwise over bf16 tokens/s). The table, a JSON of everything and the children's logs go
to --out (default $OUT, else ./acceptance-out). No Ray, no MLflow: the engine runs under torchrun.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import runpy
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from trainlab.bench import acceptance_plan as plan_mod
from trainlab.bench.acceptance_report import format_report, targets

REPO = Path(__file__).resolve().parents[3]
PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # platform/: what children need on sys.path
PARTS = ("env", "table", "overhead", "tests")
RUN_ORDER = ("bf16", "fp8_tensorwise", "fp8_rowwise", "fp8_delayed", "fp16", "fp32+tf32", "fp32")
"""The table trains the modes of the target first, so a budget that runs out cuts the rest."""
COMPILED = {"bf16", "fp16", "fp8_tensorwise", "fp8_rowwise", "fp8_delayed"}
"""Modes the table compiles (per block, as torchtitan): FP8 pays only compiled, and bf16 is its
reference. fp32 and tf32 steps are matmul-bound; they run eager to keep compile time in budget."""

_BLOCKER = '''import sys
class _Absent:
    """Written by trainlab.bench.acceptance --without: these packages behave as not installed."""
    names = {names!r}
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {{name!r}} (hidden by --without)", name=name)
        return None
sys.meta_path.insert(0, _Absent())
'''


def without(names: list[str]) -> str:
    """A folder whose sitecustomize hides `names` in every Python that has it on PYTHONPATH
    (children and, once added to sys.path and imported, this one)."""
    folder = tempfile.mkdtemp(prefix="trainlab-without-")
    Path(folder, "sitecustomize.py").write_text(_BLOCKER.format(names=sorted(names)))
    return folder


def child_env(extra_path: list[str]) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([*extra_path, str(PACKAGE_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


class Children:
    """Runs each part's processes with a deadline, their output appended to one log file."""

    def __init__(self, *, log: Path, env: dict[str, str], deadline: float, cwd: Path):
        self.log, self.env, self.deadline, self.cwd = log, env, deadline, cwd

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, title: str, cmd: list[str], *, cwd: Path | None = None) -> tuple[int | None, str]:
        """(exit code or None when it ran out of time, its output)."""
        timeout = self.left()
        if timeout < 5:
            return None, "not started: the time budget is spent"
        with self.log.open("a") as f:
            f.write(f"\n===== {title}: {' '.join(cmd)}\n")
            f.flush()
            start = f.tell()
            # a session of its own: on time-out the whole tree goes (torchrun's workers too)
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=self.env,
                                    cwd=cwd or self.cwd, start_new_session=True)
            try:
                code: int | None = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                code = None
        with self.log.open() as f:
            f.seek(start)
            return code, f.read()


def _tail(output: str, n: int = 12) -> str:
    return "\n".join("    " + line for line in output.strip().splitlines()[-n:])


def _error_line(output: str) -> str:
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^\w*(Error|Exception)\b", line)]
    return (errors or lines or ["no output"])[-1][:200]


# ---- env -----------------------------------------------------------------------------------
def environment(device: torch.device, *, quick: bool) -> dict:
    info: dict = {"python": sys.version.split()[0], "torch": torch.__version__,
                  "cuda": torch.version.cuda, "device_type": device.type}
    for name in ("torchao", "hydra", "omegaconf", "ray", "mlflow"):
        try:
            found = importlib.util.find_spec(name) is not None
        except ImportError:
            found = False
        info[name] = _version(name) if found else "absent"
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(device=torch.cuda.get_device_name(device), capability=list(torch.cuda.get_device_capability(device)),
                    memory_gb=props.total_memory / 1e9, gpus=torch.cuda.device_count())
    else:
        import platform

        import psutil

        info.update(device=f"cpu ({platform.machine()})", capability=None,
                    memory_gb=psutil.virtual_memory().total / 1e9, gpus=0)
    n = 512 if quick or device.type == "cpu" else 8192
    info["matmul_tflops"] = {d: plan_mod.matmul_tflops(device, d, n=n) for d in ("bf16", "fp16", "tf32", "fp32", "fp8")}
    info["matmul_size"] = n
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return info


def _version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    dist = {"hydra": "hydra-core"}.get(name, name)
    try:
        return version(dist)
    except PackageNotFoundError:
        return "present"


# ---- table ---------------------------------------------------------------------------------
def table_overrides(*, device: str, sizing: plan_mod.Sizing, steps: int, eval_batches: int, quick: bool,
                    vocab_size: int, extra: list[str]) -> list[str]:
    return [f"model={sizing.model}", "data=markov", f"data.vocab_size={vocab_size}",
            f"train.max_steps={steps}", f"train.seq_len={sizing.seq_len}",
            f"train.micro_batch_size={sizing.micro_batch}", f"train.global_batch_size={sizing.micro_batch}",
            "train.eval_every=0", f"train.eval_batches={eval_batches}",
            # sampled numerics steps add passes and (compiled) a second graph: speed only here
            "train.numerics_every=0", "train.checkpoint_every=0", "tracking=none",
            "optim.lr=3e-4", f"cluster.device={device}", "cluster.num_workers=1",
            *([] if quick else ["train.compile_unit=block"]), *extra]


def run_table(children: Children, modes: list[str], *, overrides: list[str], compiled: set[str],
              work: Path) -> list[dict]:
    rows = []
    for mode in sorted(modes, key=lambda m: RUN_ORDER.index(m) if m in RUN_ORDER else len(RUN_ORDER)):
        out = work / f"{mode.replace('+', '_')}.json"
        compile_flag = f"train.compile={'true' if mode in compiled else 'false'}"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
               "-m", "trainlab.bench.fp8", "--precisions", mode, "--json", str(out), *overrides, compile_flag]
        t0 = time.monotonic()
        code, output = children.run(f"table {mode}", cmd)
        took = time.monotonic() - t0
        if code == 0 and out.is_file():
            row = json.loads(out.read_text())["rows"][0]
            row["wall_s"] = took
            print(f"  {mode:<16} {row['tokens_per_s']:>12,.0f} tokens/s  val loss {row['val_loss']:.4f}  "
                  f"({took:.0f} s)", flush=True)
        else:
            why = "out of time" if code is None else _error_line(output)
            row = {"precision": mode, "status": f"error: {why}", "wall_s": took, "compile": mode in compiled}
            print(f"  {mode:<16} failed ({took:.0f} s): {why}\n{_tail(output)}", flush=True)
        rows.append(row)
    order = {m: i for i, m in enumerate(modes)}
    return sorted(rows, key=lambda r: order.get(r["precision"], len(order)))


# ---- overhead and tests ------------------------------------------------------------------
def run_overhead(children: Children, *, overrides: list[str], repeats: int) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
           "-m", "trainlab.bench.overhead", "--repeats", str(repeats), *overrides]
    code, output = children.run("overhead", cmd)
    ratio = re.search(r"^ratio: ([0-9.]+)", output, re.M)
    median = re.search(r"^median: engine ([0-9,]+) tok/s\s+bare ([0-9,]+) tok/s", output, re.M)
    if code != 0 or ratio is None:
        why = "out of time" if code is None else _error_line(output)
        print(f"  overhead failed: {why}\n{_tail(output)}", flush=True)
        return {"status": f"error: {why}", "overrides": overrides}
    result = {"status": "finished", "ratio": float(ratio.group(1)), "overrides": overrides}
    if median:
        result.update(engine_tokens_per_s=float(median.group(1).replace(",", "")),
                      bare_tokens_per_s=float(median.group(2).replace(",", "")))
    print(f"  engine / bare loop: {result['ratio']:.3f}", flush=True)
    return result


def run_tests(children: Children, *, select: str) -> dict:
    cmd = [sys.executable, "-m", "pytest", "tests/gpu", "-m", select, "-q", "-p", "no:cacheprovider", "-rfEs"]
    code, output = children.run("tests", cmd, cwd=REPO)
    summary = [line for line in output.splitlines() if re.search(r"\d+ (passed|failed|skipped|error)", line)]
    failed = [line for line in output.splitlines() if line.startswith(("FAILED", "ERROR"))]
    text = summary[-1].strip("= ") if summary else ("out of time" if code is None else _error_line(output))
    print(f"  tests/gpu: {text}", flush=True)
    for line in failed:
        print(f"    {line[:200]}", flush=True)
    return {"exit_code": code, "summary": text, "failed": failed}


# ---- the command ---------------------------------------------------------------------------
def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="trainlab bench acceptance", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated of {', '.join(PARTS)}")
    ap.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    ap.add_argument("--quick", action="store_true", help="tiny model, few steps, no compile: the plumbing only")
    ap.add_argument("--modes", default=",".join(plan_mod.TABLE_MODES), help="the table's modes (fp32+tf32: TF32)")
    ap.add_argument("--model", default="auto", help="the table's preset; auto = the largest that fits")
    ap.add_argument("--steps", type=int, default=0, help="steps per mode; 0 = as many as fit (at most 60)")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=4096, help="markov corpus vocabulary (at most 4096)")
    ap.add_argument("--overhead-model", default="350m")
    ap.add_argument("--tests", default="gpu", help="pytest -m expression for tests/gpu")
    ap.add_argument("--budget-s", type=float, default=570.0, help="wall-clock budget of the whole run")
    ap.add_argument("--out", default=os.environ.get("OUT") or "acceptance-out")
    ap.add_argument("--without", default="", help="comma-separated packages to hide (simulates the GPU machine)")
    ap.add_argument("overrides", nargs="*", default=[], help="Hydra overrides added to every table run")
    args = ap.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    modes = [m for m in args.modes.split(",") if m]
    for p in parts:
        if p not in PARTS:
            ap.error(f"--parts: {p!r} is not one of {', '.join(PARTS)}")
    t_start = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "acceptance.log"
    log.write_text("")
    extra_path = []
    if args.without:
        extra_path.append(without(args.without.split(",")))
        runpy.run_path(str(Path(extra_path[0], "sitecustomize.py")))  # here too: env reports them absent

    device = torch.device("cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
                          else "cpu")
    env = environment(device, quick=args.quick)
    print(f"acceptance on {env['device']} x{env['gpus'] or 1}: torch {env['torch']} (CUDA {env['cuda']}), "
          f"torchao {env['torchao']}, hydra {env['hydra']}, ray {env['ray']}, mlflow {env['mlflow']}", flush=True)
    rates = env["matmul_tflops"]
    print("matmul TFLOP/s at {0}^3: {1}".format(env["matmul_size"], ", ".join(
        f"{k} {v:.3g}" if v else f"{k} -" for k, v in rates.items())), flush=True)
    if env["hydra"] == "absent":
        print("error: hydra-core is not installed; on the GPU machine carry gpu-wheels/ (made by "
              "bash .ci/gpu-wheels.sh) and run bash .ci/gpu-accept", file=sys.stderr)
        return 2

    # ---- the plan and its estimate ----
    quick = args.quick
    cuda = device.type == "cuda"
    if quick:
        sizing = plan_mod.size_of(args.model if args.model != "auto" else "tiny", vocab_size=64, seq_len=64,
                                  micro_batch=4)
        vocab, eval_batches, compiled = 64, 2, set()
    else:
        vocab, eval_batches, compiled = args.vocab, 8, COMPILED & set(modes)
        sizing = (plan_mod.largest_fitting(env["memory_gb"], vocab_size=vocab, seq_len=args.seq_len,
                                           micro_batch=args.micro_batch) if args.model == "auto"
                  else plan_mod.size_of(args.model, vocab_size=vocab, seq_len=args.seq_len,
                                        micro_batch=args.micro_batch))
    flops_per_step = sizing.flops_per_token * sizing.micro_batch * sizing.seq_len
    startup_s, compile_s = (25.0, 60.0) if cuda else (10.0, 120.0)
    tests_s = 240.0 if cuda else 30.0
    overhead_s = 60.0 if cuda and not quick else 40.0
    others = (tests_s if "tests" in parts else 0) + (overhead_s if "overhead" in parts else 0)
    est = dict(flops_per_step=flops_per_step, rates=rates, eval_batches=eval_batches, startup_s=startup_s,
               compile_s=compile_s, compiled=compiled)
    steps = args.steps or (8 if quick else plan_mod.fit_steps(
        modes, budget_s=max(60.0, args.budget_s - others - 20), max_steps=60, min_steps=20, **est))
    per_mode = plan_mod.table_seconds(modes, steps=steps, **est) if "table" in parts else {}
    print(f"plan: model {sizing.model} ({sizing.params / 1e6:,.3g}M params, fp32 estimate "
          f"{sizing.memory_gb:.1f} GB of {env['memory_gb']:.0f}), markov vocab {vocab}, {steps} steps x "
          f"{sizing.micro_batch} x {sizing.seq_len} tokens, the same tokens for every mode; "
          f"{flops_per_step / 1e12:.1f} TFLOP a step", flush=True)
    total = sum(per_mode.values()) + others
    print("estimate: " + ", ".join(f"{m} {s:.0f} s" for m, s in per_mode.items())
          + (f", overhead {overhead_s:.0f} s" if "overhead" in parts else "")
          + (f", tests {tests_s:.0f} s" if "tests" in parts else "")
          + f"; total {total:.0f} s of a {args.budget_s:.0f} s budget", flush=True)
    if total > args.budget_s:
        print("warning: the estimate is over the budget: parts that do not fit are cut; run them in a "
              "second call, e.g. --parts tests", flush=True)

    work = Path(tempfile.mkdtemp(prefix="trainlab-accept-"))
    children = Children(log=log, env=child_env(extra_path), deadline=t_start + args.budget_s, cwd=work)
    result: dict = {"env": env, "plan": {"model": sizing.model, "params": sizing.params, "steps": steps,
                                         "micro_batch": sizing.micro_batch, "seq_len": sizing.seq_len,
                                         "vocab": vocab, "estimate_s": per_mode, "budget_s": args.budget_s},
                    "rows": [], "overhead": None, "tests": None}
    if "table" in parts:
        print("table:", flush=True)
        overrides = table_overrides(device=device.type, sizing=sizing, steps=steps, eval_batches=eval_batches,
                                    quick=quick, vocab_size=vocab, extra=args.overrides)
        result["table_overrides"] = overrides
        result["rows"] = run_table(children, modes, overrides=overrides, compiled=compiled, work=work)
    if "overhead" in parts:
        print("overhead:", flush=True)
        model, seq, steps_o, repeats = ("tiny", 64, 10, 1) if quick else (args.overhead_model, 1024, 40, 3)
        result["overhead"] = run_overhead(children, repeats=repeats, overrides=[
            f"model={model}", "data=markov", f"data.vocab_size={vocab}", "precision=bf16" if cuda else "precision=fp32",
            f"train.seq_len={seq}", "train.micro_batch_size=8", "train.global_batch_size=8",
            f"train.max_steps={steps_o}", "tracking=none", f"cluster.device={device.type}", "cluster.num_workers=1"])
    if "tests" in parts:
        print("tests:", flush=True)
        result["tests"] = run_tests(children, select=args.tests)
    result["targets"] = targets(result, gpu=cuda)
    result["wall_s"] = time.monotonic() - t_start
    report = format_report(result)
    (out / "acceptance.txt").write_text(report + "\n")
    (out / "acceptance.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(report, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
