"""The GPU acceptance run: what a first run on a GPU must show, in one command.

    bash .ci/gpu-accept                       # GPU machine: installs the carried wheels, then this
    python -m trainlab.bench.acceptance       # wherever Hydra and torchao are installed
    python -m trainlab.bench.acceptance --device cpu --quick --without ray,mlflow   # the plumbing, on a CPU

Parts (--parts), each in processes of its own, so one that fails or hangs hides nothing else:
  env       device, capability, memory, versions, which of Ray/MLflow/Hydra/torchao import;
            bare matmul TFLOP/s per dtype, measured here (they size the plan)
  table     every precision mode trains the same model on the same tokens from the same init,
            under `torchrun --nproc-per-node 1` (trainlab.bench.fp8: the compiled modes in one
            process, the eager ones in another): tokens/s, MFU, validation loss, peak memory.
            The model is the largest preset that fits; the steps are as many as fit the time
            budget (acceptance_plan), printed before it starts
  overhead  the engine against a bare PyTorch loop (trainlab.bench.overhead, tracking=none)
  tests     pytest tests/gpu -m gpu ('gpu and not slow' beside the table, which covers the slow one)
With --parts left as all, parts that do not fit --budget-s after the table are deferred, and
the command for a second call is printed.
Ends with the table, issue 15's targets (pass / FAIL on a GPU) and, last, `fp8/bf16: X.XXx`
(fp8_tensorwise over bf16 tokens/s). The table, a JSON of everything and the children's logs go
to --out (default $OUT, else ./acceptance-out). No Ray, no MLflow: the engine runs under torchrun.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import re
import runpy
import sys
import tempfile
import time
from pathlib import Path

import torch

from trainlab.bench import acceptance_plan as plan_mod
from trainlab.bench.acceptance_children import Children, child_env, error_line, tail, without
from trainlab.bench.acceptance_report import format_report, targets
from trainlab.devices import resolve_device

REPO = Path(__file__).resolve().parents[3]
PARTS = ("env", "table", "overhead", "tests")
RUN_ORDER = ("bf16", "fp8_tensorwise", "fp8_rowwise", "fp8_delayed", "fp16", "fp32+tf32", "fp32")
"""The table trains the modes of the target first, so a budget that runs out cuts the rest."""
COMPILED = {"bf16", "fp16", "fp8_tensorwise", "fp8_rowwise", "fp8_delayed"}
"""Modes the table compiles (per block, as torchtitan): FP8 pays only compiled, and bf16 is its
reference. fp32 and tf32 steps are matmul-bound; they run eager to keep compile time in budget."""
ENV_S = 20.0
"""Estimated start of this command: imports, the matmul probe, composing the plan."""
PROCESS_S = {"cuda": 30.0, "cpu": 15.0}
"""Estimated start of a torchrun process: Python, torch, CUDA, imports (estimates only)."""
SETUP_S = {"cuda": 10.0, "cpu": 5.0}
"""Estimated corpus and model build of each mode in a running process."""
COMPILE_S = 45.0
"""Estimated compile of one transformer block, forward and backward, per compiled mode."""
TESTS_S = {"gpu": 420.0, "gpu and not slow": 200.0}
"""Estimated pytest tests/gpu on one H100 per selection (the slow one compiles the FP8 bench)."""

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
        info.update(device=torch.cuda.get_device_name(device),
                    capability=list(torch.cuda.get_device_capability(device)),
                    memory_gb=props.total_memory / 1e9, gpus=torch.cuda.device_count())
    else:
        import platform

        import psutil

        info.update(device=f"cpu ({platform.machine()})", capability=None,
                    memory_gb=psutil.virtual_memory().total / 1e9, gpus=0)
    n = 512 if quick or device.type == "cpu" else 8192
    info["matmul_tflops"] = {d: plan_mod.matmul_tflops(device, d, n=n)
                             for d in ("bf16", "fp16", "tf32", "fp32", "fp8")}
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
    """The compiled modes in one torchrun process and the eager ones in another (a process
    start and a corpus cost once); a mode whose process died before it ran gets one of its own."""
    order = sorted(modes, key=lambda m: RUN_ORDER.index(m) if m in RUN_ORDER else len(RUN_ORDER))
    groups = [[m for m in order if m in compiled], [m for m in order if m not in compiled]]
    rows: dict[str, dict] = {}
    for group in filter(None, groups):
        rows.update(_run_modes(children, group, overrides=overrides, compiled=group[0] in compiled,
                               work=work))
    for mode in [m for m in order if m not in rows]:  # its process crashed or ran out of time first
        rows.update(_run_modes(children, [mode], overrides=overrides, compiled=mode in compiled, work=work))
    return [rows.get(m) or {"precision": m, "status": "error: did not run", "compile": m in compiled}
            for m in modes]


def _run_modes(children: Children, modes: list[str], *, overrides: list[str], compiled: bool,
               work: Path) -> dict[str, dict]:
    out = work / f"{'_'.join(modes).replace('+', '-')}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
           "-m", "trainlab.bench.fp8", "--keep-going", "--precisions", ",".join(modes), "--json", str(out),
           *overrides, f"train.compile={'true' if compiled else 'false'}"]
    t0 = time.monotonic()
    code, output = children.run(f"table {','.join(modes)}", cmd)
    rows = {r["precision"]: r for r in json.loads(out.read_text())["rows"]} if out.is_file() else {}
    for mode in modes:
        row = rows.get(mode)
        if row is None:
            continue
        row.setdefault("compile", compiled)
        if row.get("status") == "finished":
            print(f"  {mode:<16} {row['tokens_per_s']:>12,.0f} tokens/s  val loss {row['val_loss']:.4f}  "
                  f"peak {row['peak_mem_gb']:.1f} GB  ({row['elapsed_s']:.0f} s training)", flush=True)
        else:
            print(f"  {mode:<16} {row['status']}", flush=True)
    missing = [m for m in modes if m not in rows]
    if missing:
        why = "out of time" if code is None else error_line(output)
        print(f"  {','.join(missing)}: no result after {time.monotonic() - t0:.0f} s ({why})\n{tail(output)}",
              flush=True)
    return rows


# ---- overhead and tests ------------------------------------------------------------------
def run_overhead(children: Children, *, overrides: list[str], repeats: int) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
           "-m", "trainlab.bench.overhead", "--repeats", str(repeats), *overrides]
    code, output = children.run("overhead", cmd)
    ratio = re.search(r"^ratio: ([0-9.]+)", output, re.M)
    median = re.search(r"^median: engine ([0-9,]+) tok/s\s+bare ([0-9,]+) tok/s", output, re.M)
    if code != 0 or ratio is None:
        why = "out of time" if code is None else error_line(output)
        print(f"  overhead failed: {why}\n{tail(output)}", flush=True)
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
    text = summary[-1].strip("= ") if summary else ("out of time" if code is None else error_line(output))
    print(f"  tests/gpu: {text}", flush=True)
    for line in failed:
        print(f"    {line[:200]}", flush=True)
    return {"exit_code": code, "summary": text, "failed": failed}


def make_plan(args, *, env: dict, device: torch.device, parts: list[str], modes: list[str]) -> dict:
    """The table's model and steps, each part's estimate, printed; parts that do not fit the
    budget after the table are deferred to a second call (when --parts was left as all)."""
    dev = device.type
    if args.quick:
        sizing = plan_mod.size_of(args.model if args.model != "auto" else "tiny", vocab_size=64, seq_len=64,
                                  micro_batch=4)
        vocab, eval_batches, compiled = 64, 2, set()
    else:
        vocab, eval_batches, compiled = args.vocab, 8, COMPILED & set(modes)
        kw = dict(vocab_size=vocab, seq_len=args.seq_len, micro_batch=args.micro_batch)
        sizing = (plan_mod.largest_fitting(env["memory_gb"], **kw) if args.model == "auto"
                  else plan_mod.size_of(args.model, **kw))
    flops_per_step = sizing.flops_per_token * sizing.micro_batch * sizing.seq_len
    select = args.tests or ("gpu and not slow" if "table" in parts else "gpu")
    tests_s = TESTS_S.get(select, max(TESTS_S.values())) if dev == "cuda" else 30.0
    overhead_s = 60.0 if dev == "cuda" and not args.quick else 40.0
    est = dict(flops_per_step=flops_per_step, rates=env["matmul_tflops"], eval_batches=eval_batches,
               setup_s=SETUP_S[dev], compile_s=0.0 if args.quick else COMPILE_S, compiled=compiled)
    processes_s = PROCESS_S[dev] * (1 + bool(compiled) * bool(set(modes) - compiled))
    table_budget = args.budget_s - ENV_S - processes_s - (overhead_s if "overhead" in parts else 0)
    steps = args.steps or (8 if args.quick else plan_mod.fit_steps(
        modes, budget_s=table_budget, max_steps=60, min_steps=20, **est))
    table_s = plan_mod.table_seconds(modes, steps=steps, **est) if "table" in parts else {}
    costs = {"table": sum(table_s.values()) + processes_s if table_s else 0.0, "overhead": overhead_s,
             "tests": tests_s}
    deferred, total = [], ENV_S
    for part in ("table", "overhead", "tests"):
        if part not in parts:
            continue
        if args.parts == ",".join(PARTS) and part != "table" and total + costs[part] > args.budget_s:
            deferred.append(part)
        else:
            total += costs[part]
    print(f"plan: model {sizing.model} ({sizing.params / 1e6:,.3g}M params, fp32 estimate "
          f"{sizing.memory_gb:.1f} GB of {env['memory_gb']:.0f}), markov vocab {vocab}, {steps} steps x "
          f"{sizing.micro_batch} x {sizing.seq_len} tokens, the same tokens for every mode; "
          f"{flops_per_step / 1e12:.3g} TFLOP a step; compiled: {', '.join(sorted(compiled)) or 'none'}",
          flush=True)
    print("estimate: " + ", ".join([f"{m} {t:.0f} s" for m, t in table_s.items()]
                                   + [f"{p} {costs[p]:.0f} s" for p in ("overhead", "tests")
                                      if p in parts and p not in deferred])
          + f"; total {total:.0f} s of a {args.budget_s:.0f} s budget", flush=True)
    if deferred:
        print(f"deferred (over the budget): {', '.join(deferred)}; run them in a second call: "
              f"bash .ci/gpu-accept --parts {','.join(deferred)}", flush=True)
    elif total > args.budget_s:
        print("warning: the estimate is over the budget; what runs past it is stopped and reported as such",
              flush=True)
    return {"sizing": dataclasses.asdict(sizing), "model": sizing.model, "params": sizing.params,
            "steps": steps,
            "micro_batch": sizing.micro_batch, "seq_len": sizing.seq_len, "vocab": vocab,
            "eval_batches": eval_batches, "compiled": sorted(compiled), "tests_select": select,
            "estimate_s": {**table_s, **{p: costs[p] for p in ("overhead", "tests") if p in parts}},
            "budget_s": args.budget_s, "deferred": deferred}


# ---- the command ---------------------------------------------------------------------------
def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="trainlab bench acceptance", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated of {', '.join(PARTS)}")
    ap.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    ap.add_argument("--quick", action="store_true",
                    help="tiny model, few steps, no compile: the plumbing only")
    ap.add_argument("--modes", default=",".join(plan_mod.TABLE_MODES),
                    help="the table's modes (fp32+tf32: TF32)")
    ap.add_argument("--model", default="auto", help="the table's preset; auto = the largest that fits")
    ap.add_argument("--steps", type=int, default=0, help="steps per mode; 0 = as many as fit (at most 60)")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=256,
                    help="markov corpus vocabulary (at most 4096; small, so the loss falls past the "
                    "unigram entropy within the steps)")
    ap.add_argument("--overhead-model", default="350m")
    ap.add_argument("--tests", default="", help="pytest -m expression for tests/gpu; default 'gpu', or "
                    "'gpu and not slow' with the table (which covers the slow FP8 bench test)")
    ap.add_argument("--budget-s", type=float, default=570.0, help="wall-clock budget of the whole run")
    ap.add_argument("--out", default=os.environ.get("OUT") or "acceptance-out")
    ap.add_argument("--without", default="",
                    help="comma-separated packages to hide (simulates the GPU machine)")
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

    device = torch.device(resolve_device(args.device, gpus=torch.cuda.is_available()))
    env = environment(device, quick=args.quick)
    print(f"acceptance on {env['device']} x{env['gpus'] or 1}: torch {env['torch']} (CUDA {env['cuda']}), "
          f"torchao {env['torchao']}, hydra {env['hydra']}, ray {env['ray']}, mlflow {env['mlflow']}",
          flush=True)
    rates = env["matmul_tflops"]
    print("matmul TFLOP/s at {0}^3: {1}".format(env["matmul_size"], ", ".join(
        f"{k} {v:.3g}" if v else f"{k} -" for k, v in rates.items())), flush=True)
    if env["hydra"] == "absent":
        print("error: hydra-core is not installed; on the GPU machine carry gpu-wheels/ (made by "
              "bash .ci/gpu-wheels.sh) and run bash .ci/gpu-accept", file=sys.stderr)
        return 2

    plan = make_plan(args, env=env, device=device, parts=parts, modes=modes)
    parts = [p for p in parts if p not in plan["deferred"]]
    work = Path(tempfile.mkdtemp(prefix="trainlab-accept-"))
    children = Children(log=log, env=child_env(extra_path), deadline=t_start + args.budget_s, cwd=work)
    result: dict = {"env": env, "plan": plan, "rows": [], "overhead": None, "tests": None}
    sizing, cuda, quick = plan_mod.Sizing(**plan["sizing"]), device.type == "cuda", args.quick
    if "table" in parts:
        print("table:", flush=True)
        overrides = table_overrides(device=device.type, sizing=sizing, steps=plan["steps"],
                                    eval_batches=plan["eval_batches"], quick=quick, vocab_size=plan["vocab"],
                                    extra=args.overrides)
        result["table_overrides"] = overrides
        result["rows"] = run_table(children, modes, overrides=overrides, compiled=set(plan["compiled"]),
                                   work=work)
    if "overhead" in parts:
        print("overhead:", flush=True)
        model, seq, steps, repeats = ("tiny", 64, 10, 1) if quick else (args.overhead_model, 1024, 40, 3)
        result["overhead"] = run_overhead(children, repeats=repeats, overrides=[
            f"model={model}", "data=markov", f"data.vocab_size={plan['vocab']}",
            f"precision={'bf16' if cuda else 'fp32'}", f"train.seq_len={seq}", "train.micro_batch_size=8",
            "train.global_batch_size=8", f"train.max_steps={steps}", "tracking=none",
            f"cluster.device={device.type}", "cluster.num_workers=1"])
    if "tests" in parts:
        print(f"tests (-m '{plan['tests_select']}'):", flush=True)
        result["tests"] = run_tests(children, select=plan["tests_select"])
    result["targets"] = targets(result, gpu=cuda)
    result["wall_s"] = time.monotonic() - t_start
    report = format_report(result)
    (out / "acceptance.txt").write_text(report + "\n")
    (out / "acceptance.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(report, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
