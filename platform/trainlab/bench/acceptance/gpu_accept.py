"""The GPU acceptance run: what a first run on a GPU must show, in two short commands.

    bash .ci/gpu-accept                       # GPU machine: installs the carried wheels, then this
    bash .ci/gpu-accept --parts tests         # the second command of the same lease
    python -m trainlab.bench.acceptance.gpu_accept       # wherever Hydra and torchao are installed
    python -m trainlab.bench.acceptance.gpu_accept --device cpu --quick --without ray,mlflow   # the plumbing, on a CPU

Parts (--parts; default env,table: the headline), each in processes of its own, so one that
fails or hangs hides nothing else:
  env       device, capability, memory, versions, which of Ray/MLflow/Hydra/torchao import;
            bare matmul TFLOP/s per dtype, measured here (they size the plan)
  table     bf16, fp8_tensorwise, fp8_rowwise, fp8_delayed (--modes) train the same model on the
            same tokens from the same init, compiled as the engine compiles them (train.compile=
            auto), under `torchrun --nproc-per-node 1` (trainlab.bench.fp8_vs_bf16), modes sharing a
            process where engine.isolation.fresh_gang_reason allows: tokens/s, MFU, val loss,
            peak memory, FP8 linears, compile seconds, each beside its estimate. The model is the
            largest preset that fits memory and the budget; the steps as many as fit
            (workload), printed before it starts
  overhead  the engine against a bare PyTorch loop, both compiled or both eager
            (trainlab.bench.engine_overhead, tracking=none)
  tests     pytest tests/gpu -m 'gpu and not slow' -v, JUnit XML to --out, stopped (SIGINT: pytest
            still writes its summary and XML) before the budget ends
The plan printed first names the commands a 15-minute lease runs, each with the timeout_s to
give the device tool, and the later ones. The report (acceptance.txt, acceptance.json in --out,
default $OUT, else ./acceptance-out) is rewritten after every mode, so a command cut at its
limit keeps every finished row; it ends with issue 15's targets (pass / FAIL on a GPU) and,
last, `fp8/bf16: X.XXx` (fp8_tensorwise over bf16 tokens/s). No Ray, no MLflow: the engine
runs under torchrun.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import re
import runpy
import sys
import tempfile
import time
from pathlib import Path

import torch

from trainlab.bench.acceptance import workload as plan_mod
from trainlab.bench.acceptance.children import Children, child_env, error_line, tail, without
from trainlab.bench.acceptance.gpu_tests import PYTEST_INTERRUPT_S, run_tests
from trainlab.bench.acceptance.report import FINISHED, format_report, lease_lines, targets, write_report
from trainlab.bench.acceptance.table_runs import Table, run_table
from trainlab.bench.acceptance.workload import Group
from trainlab.devices import resolve_device

REPO = Path(__file__).resolve().parents[4]
PARTS = ("env", "table", "overhead", "tests")
HEADLINE_PARTS = ("env", "table")
TESTS_SELECT = "gpu and not slow"
"""The second command's tests: the slow one is the FP8 bench, which the table covers."""
REPORT_S = 10.0
"""Kept at the end of every command for writing the report (and pytest's XML after SIGINT)."""
EVAL_BATCHES = 8
OVERHEAD_BATCH = 8


def overhead_shape(args) -> tuple[str, int, int, int]:
    """The overhead part's model, seq_len, steps and rounds."""
    return ("tiny", 64, 10, 1) if args.quick else (args.overhead_model, 1024, 40, 3)


# ---- env -----------------------------------------------------------------------------------
def environment(device: torch.device, *, quick: bool, probe: bool) -> dict:
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
        info.update(device=torch.cuda.get_device_name(device),
                    capability=list(torch.cuda.get_device_capability(device)),
                    memory_gb=props.total_memory / 1e9, gpus=torch.cuda.device_count())
    else:
        import platform

        import psutil

        info.update(device=f"cpu ({platform.machine()})", capability=None,
                    memory_gb=psutil.virtual_memory().total / 1e9, gpus=0)
    n = 512 if quick or device.type == "cpu" else 8192
    info["matmul_tflops"] = {d: plan_mod.matmul_tflops(device, d, n=n) if probe else None
                             for d in ("bf16", "fp16", "tf32", "fp32", "fp8")}
    info["matmul_size"] = n if probe else None
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


# ---- the plan ------------------------------------------------------------------------------
QUICK_OVERRIDES = ("precision.keep_hp=[output]",)
"""--quick's tiny model: its linears are all too small for FP8 to pay (keep_hp 'small'), so the
FP8 modes would convert none; the plumbing run converts them anyway."""


def base_overrides(*, device: str, extra: list[str], quick: bool = False) -> list[str]:
    """What every table row shares besides the model and steps (plan_mod.TABLE_DATA: the corpus)."""
    return [*plan_mod.TABLE_DATA, *(QUICK_OVERRIDES if quick else ()), "train.eval_every=0",
            # sampled numerics steps add passes and (compiled) a second graph: speed only here
            "train.numerics_every=0", "train.checkpoint_every=0", "tracking=none", "optim.lr=3e-4",
            f"cluster.device={device}", "cluster.num_workers=1", f"train.compile_unit={plan_mod.COMPILE_UNIT}",
            *extra]


def table_overrides(base: list[str], *, sizing: plan_mod.Sizing, steps: int, eval_batches: int) -> list[str]:
    return [f"model={sizing.model}", *base, f"train.max_steps={steps}", f"train.seq_len={sizing.seq_len}",
            f"train.micro_batch_size={sizing.micro_batch}", f"train.global_batch_size={sizing.micro_batch}",
            f"train.eval_batches={eval_batches}"]


def mode_configs(base: list[str], modes: list[str]) -> dict:
    from trainlab.bench.fp8_vs_bf16 import mode_overrides
    from trainlab.config import compose_run_config

    return {m: compose_run_config([*base, *mode_overrides(m)]) for m in modes}


def make_plan(args, *, env: dict, device: torch.device, parts: list[str], modes: list[str]) -> dict:
    """The table's corpus, processes, model and steps, each part's estimate, and the lease's
    commands; printed."""
    from trainlab.data import build_corpus
    from trainlab.data.batches import num_windows
    from trainlab.engine.isolation import compiles

    dev, costs = device.type, plan_mod.COSTS[device.type]
    base = base_overrides(device=dev, extra=args.overrides, quick=args.quick)
    configs = mode_configs(base, modes)
    corpus = build_corpus(next(iter(configs.values())).data)
    groups = plan_mod.group_modes(configs, device=dev)
    compiled = {m for m, run in configs.items() if compiles(run, device=dev)}
    seq, micro = (64, 4) if args.quick else (args.seq_len, args.micro_batch)
    if args.quick or args.model != "auto":
        candidates = [plan_mod.size_of("tiny" if args.model == "auto" else args.model,
                                       vocab_size=corpus.vocab_size, seq_len=seq, micro_batch=micro)]
    else:
        candidates = plan_mod.fitting(env["memory_gb"], vocab_size=corpus.vocab_size, seq_len=seq,
                                      micro_batch=micro)
    val_windows = num_windows(len(corpus.val), min(c.seq_len for c in candidates))
    eval_batches = min(2 if args.quick else EVAL_BATCHES, val_windows // micro)
    if eval_batches < 1 or num_windows(len(corpus.train), candidates[0].seq_len) < micro:
        raise SystemExit(f"error: the table's corpus ({corpus.description}) holds too few windows of "
                         f"{candidates[0].seq_len} tokens for batches of {micro}: lower --seq-len or change "
                         "workload.TABLE_DATA")
    ov_model, ov_seq, ov_steps, ov_repeats = overhead_shape(args)
    ov_sizing = plan_mod.size_of(ov_model, vocab_size=corpus.vocab_size, seq_len=ov_seq, micro_batch=OVERHEAD_BATCH)
    overhead_s = plan_mod.overhead_seconds(ov_sizing, steps=ov_steps, repeats=ov_repeats, rates=env["matmul_tflops"],
                                           costs=costs, compiled=dev == "cuda") if "overhead" in parts else 0.0
    tests_s = plan_mod.TESTS_MIN_S if "tests" in parts else 0.0
    est = dict(eval_batches=eval_batches, rates=env["matmul_tflops"], compiled=compiled)
    table = plan_mod.plan_table(candidates, modes, processes=len(groups), costs=costs,
                                budget_s=args.budget_s - overhead_s - tests_s - REPORT_S,
                                steps=args.steps or (8 if args.quick else 0), **est)
    sizing = table.sizing
    epochs = table.steps * micro / max(1, num_windows(len(corpus.train), sizing.seq_len))
    plan = {"sizing": dataclasses.asdict(sizing), "model": sizing.model, "params": sizing.params,
            "steps": table.steps, "micro_batch": micro, "seq_len": sizing.seq_len, "vocab": corpus.vocab_size,
            "data": f"{corpus.name} corpus (vocab {corpus.vocab_size}, {len(corpus.train):,} train tokens, "
                    f"{epochs:.2g} passes)", "data_overrides": list(plan_mod.TABLE_DATA),
            "eval_batches": eval_batches, "compiled": sorted(compiled), "tests_select": args.tests,
            "groups": [{"modes": g.modes, "why": g.why} for g in groups],
            "estimate_s": {**(table.seconds if "table" in parts else {}),
                           **({"overhead": overhead_s} if overhead_s else {})},
            "budget_s": args.budget_s}
    total = (table.total_s if "table" in parts else costs.env_s) + overhead_s + tests_s
    # the tests run to the end of the budget at most, SIGINT PYTEST_INTERRUPT_S before it
    tests_until = args.budget_s - REPORT_S - PYTEST_INTERRUPT_S - (total - tests_s)
    if "table" in parts:
        print(f"plan: model {sizing.model} ({sizing.params / 1e6:,.3g}M params, fp32 estimate {sizing.memory_gb:.1f} GB "
              f"of {env['memory_gb']:.0f}), {plan['data']}, {table.steps} steps x {micro} x {sizing.seq_len} "
              f"tokens, the same tokens for every mode; {sizing.flops_per_step / 1e12:.3g} TFLOP a step; compiled "
              f"(train.compile=auto): {', '.join(sorted(compiled)) or 'none'}", flush=True)
        print("processes: " + " ".join(f"[{', '.join(g.modes)}{': fresh, ' + g.why if g.why else ''}]"
                                       for g in groups), flush=True)
    print("estimate: " + ", ".join([f"{m} {s:.0f} s" for m, s in plan["estimate_s"].items()]
                                   + ([f"tests up to {tests_until:.0f} s (then stopped, names and reasons kept)"]
                                      if tests_s else []))
          + f"; total {total - tests_s:.0f} s{' before the tests' if tests_s else ''} of a "
            f"{args.budget_s:.0f} s budget", flush=True)
    if total > args.budget_s:
        print("warning: the estimate is over the budget; what runs past it is stopped and reported as such",
              flush=True)
    later_s = None  # the later command's estimate: the headline's model and steps on this device
    if "table" in parts and not args.quick and env["matmul_tflops"].get("bf16"):
        later_s = later_seconds(sizing, steps=table.steps, env=env, costs=costs, base=base, dev=dev,
                                eval_batches=eval_batches, overhead=ov_sizing, overhead_shape=(ov_steps, ov_repeats))
    plan["lease"] = plan_mod.lease_commands(model=sizing.model if "table" in parts and not args.quick else "",
                                            steps=table.steps,
                                            later_s=later_s, tests_select=TESTS_SELECT)
    for line in lease_lines(plan["lease"]):
        print(line, flush=True)
    return plan


def later_seconds(sizing, *, steps: int, env: dict, costs, base: list[str], dev: str, eval_batches: int,
                  overhead: plan_mod.Sizing, overhead_shape: tuple[int, int]) -> float:
    """The estimate of the later command: LATER_MODES on the headline's model and steps, and the overhead."""
    from trainlab.engine.isolation import compiles

    configs = mode_configs(base, list(plan_mod.LATER_MODES))
    compiled = {m for m, run in configs.items() if compiles(run, device=dev)}
    groups = plan_mod.group_modes(configs, device=dev)
    seconds = plan_mod.table_seconds(plan_mod.LATER_MODES, steps=steps, eval_batches=eval_batches, sizing=sizing,
                                     rates=env["matmul_tflops"], costs=costs, compiled=compiled)
    return (costs.env_s + len(groups) * costs.process_s + sum(seconds.values())
            + plan_mod.overhead_seconds(overhead, steps=overhead_shape[0], repeats=overhead_shape[1],
                                        rates=env["matmul_tflops"], costs=costs, compiled=dev == "cuda"))


# ---- overhead and tests ------------------------------------------------------------------
def run_overhead(children: Children, *, overrides: list[str], repeats: int) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
           "-m", "trainlab.bench.engine_overhead", "--repeats", str(repeats), *overrides]
    code, output = children.run("overhead", cmd)
    ratio = re.search(r"^ratio: ([0-9.]+)", output, re.M)
    median = re.search(r"^median: engine ([0-9,]+) tok/s\s+bare ([0-9,]+) tok/s", output, re.M)
    unit = re.search(r" compile=(\w+) \(both loops\)", output)
    compiled = None if unit is None else ("eager" if unit.group(1) == "off" else f"compiled (unit {unit.group(1)})")
    if code != 0 or ratio is None:
        why = "out of time" if code is None else error_line(output)
        print(f"  overhead failed: {why}\n{tail(output)}", flush=True)
        return {"status": f"error: {why}", "overrides": overrides, "compiled": compiled}
    result = {"status": FINISHED, "ratio": float(ratio.group(1)), "overrides": overrides, "compiled": compiled}
    if median:
        result.update(engine_tokens_per_s=float(median.group(1).replace(",", "")),
                      bare_tokens_per_s=float(median.group(2).replace(",", "")))
    print(f"  engine / bare loop, both {compiled}: {result['ratio']:.3f}", flush=True)
    return result


# ---- the command ---------------------------------------------------------------------------
def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="trainlab bench acceptance", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default=",".join(HEADLINE_PARTS), help=f"comma-separated of {', '.join(PARTS)}")
    ap.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    ap.add_argument("--quick", action="store_true", help="tiny model, few steps: the plumbing only")
    ap.add_argument("--modes", default=",".join(plan_mod.HEADLINE_MODES),
                    help=f"the table's modes, of {', '.join(plan_mod.TABLE_MODES)} (fp32+tf32: TF32)")
    ap.add_argument("--model", default="auto", help="the table's preset; auto = the largest that fits")
    ap.add_argument("--steps", type=int, default=0,
                    help=f"steps per mode; 0 = as many as fit (at most {plan_mod.MAX_STEPS})")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--overhead-model", default="350m")
    ap.add_argument("--tests", default=TESTS_SELECT, help="pytest -m expression for tests/gpu")
    ap.add_argument("--budget-s", type=float, default=plan_mod.BUDGET_S,
                    help="wall-clock budget of the whole run (the lease plan gives the device tool "
                    f"{plan_mod.LEASE_MARGIN_S:.0f} s more)")
    ap.add_argument("--out", default=os.environ.get("OUT") or "acceptance-out")
    ap.add_argument("--without", default="",
                    help="comma-separated packages to hide (simulates the GPU machine)")
    ap.add_argument("overrides", nargs="*", default=[], help="Hydra overrides added to every table run")
    args = ap.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    modes = plan_mod.run_order([m for m in args.modes.split(",") if m])
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

    device = torch.device(resolve_device(args.device, gpus=torch.cuda.is_available()))
    env = environment(device, quick=args.quick, probe="table" in parts or "overhead" in parts)
    print(f"acceptance on {env['device']} x{env['gpus'] or 1}: torch {env['torch']} (CUDA {env['cuda']}), "
          f"torchao {env['torchao']}, hydra {env['hydra']}, ray {env['ray']}, mlflow {env['mlflow']}",
          flush=True)
    rates = env["matmul_tflops"]
    if env["matmul_size"]:
        print("matmul TFLOP/s at {0}^3: {1}".format(env["matmul_size"], ", ".join(
            f"{k} {v:.3g}" if v else f"{k} -" for k, v in rates.items())), flush=True)
    if env["hydra"] == "absent":
        print("error: hydra-core is not installed; on the GPU machine carry gpu-wheels/ (made by "
              "bash .ci/gpu-wheels.sh) and run bash .ci/gpu-accept", file=sys.stderr)
        return 2

    plan = make_plan(args, env=env, device=device, parts=parts, modes=modes)
    work = Path(tempfile.mkdtemp(prefix="trainlab-accept-"))
    deadline = t_start + args.budget_s - REPORT_S
    children = Children(log=log, env=child_env(extra_path), deadline=deadline, cwd=work)
    result: dict = {"env": env, "plan": plan, "lease": plan["lease"], "overhead": None, "tests": None,
                    "rows": [{"precision": m, "status": "pending"} for m in modes] if "table" in parts else []}
    cuda = device.type == "cuda"

    def flush() -> None:
        result["targets"] = targets(result, gpu=cuda)
        result["wall_s"] = time.monotonic() - t_start
        write_report(out, result)

    flush()  # the plan is in --out before anything trains
    if "table" in parts:
        print("table:", flush=True)
        base = base_overrides(device=device.type, extra=args.overrides, quick=args.quick)
        overrides = table_overrides(base, sizing=plan_mod.Sizing(**plan["sizing"]), steps=plan["steps"],
                                    eval_batches=plan["eval_batches"])
        result["table_overrides"] = overrides
        groups = [Group(g["modes"], why=g["why"]) for g in plan["groups"]]
        run_table(children, groups, overrides=overrides, work=work,
                  table=Table(result, flush=flush, estimate_s=plan["estimate_s"]))
    if "overhead" in parts:
        print("overhead:", flush=True)
        model, seq, steps, repeats = overhead_shape(args)
        result["overhead"] = run_overhead(children, repeats=repeats, overrides=[
            f"model={model}", *plan_mod.TABLE_DATA, f"precision={'bf16' if cuda else 'fp32'}",
            f"train.seq_len={seq}", f"train.micro_batch_size={OVERHEAD_BATCH}",
            f"train.global_batch_size={OVERHEAD_BATCH}",
            f"train.max_steps={steps}", "tracking=none", f"cluster.device={device.type}", "cluster.num_workers=1"])
        flush()
    if "tests" in parts:
        print(f"tests (-m '{args.tests}'), stopped {deadline - PYTEST_INTERRUPT_S - time.monotonic():.0f} s "
              "from now at the latest:", flush=True)
        result["tests"] = run_tests(children, select=args.tests, out=out.resolve(),
                                    deadline=deadline - PYTEST_INTERRUPT_S, cwd=REPO)
    flush()
    print(format_report(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
