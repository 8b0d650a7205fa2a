"""Every `trainlab bench` the README or the docs pages name runs, in a smoke size, and ends with its ratio line.

Each bench runs through the real command (`trainlab bench NAME`, a fresh process as a user's)
with the docs' options where they fit a 2-core CPU and overrides that make it small (the tiny
model, a few steps, one round); the line each bench ends with, its ratio, must have the docs'
format and hold a finite positive number. The numbers themselves are the machine's (the docs'
measurements page), not asserted. Benches tested in files of their own are named in ELSEWHERE, and
the first test fails when the README or a docs page names a bench that neither covers.
"""

from __future__ import annotations

import math
import re
import subprocess

import pytest

from conftest import REPO, trainlab_cmd
from trainlab.bench import MODULES

SMALL = ["model=tiny", "data=markov", "train.seq_len=32"]
# name: (id, the bench's arguments at smoke size, the ratio line, the number in it that must be > 0)
SMOKE = {
    # tracking=none: MLflow's writer and store cost a minute here (test_engine_overhead.py runs them)
    "overhead": ("overhead", ["--repeats", "1", *SMALL, "train.max_steps=5", "train.global_batch_size=4",
                              "train.micro_batch_size=4", "tracking=none"],
                 r"ratio: (\d+\.\d{3})"),
    "determinism": ("determinism", ["--workers", "2", "--repeats", "1", *SMALL, "train.max_steps=3",
                                    "train.global_batch_size=8", "train.micro_batch_size=2"],
                    r"cost: (\d+\.\d{2})x"),
    "balance": ("balance", ["--workers", "2", "--modes", "equal,weighted", *SMALL, "train.max_steps=4",
                            "parallel.dp_balance_warmup=2", "train.global_batch_size=8",
                            "train.micro_batch_size=2"],
                r"mode weighted: speedup: (\d+\.\d{2})x"),
    # the precision page's `model=1b train.compile=true` is a GPU's size: compiling on CPU would take minutes
    "fp8": ("fp8", ["--precisions", "bf16,fp8_tensorwise", *SMALL, "train.max_steps=3",
                    "train.global_batch_size=4", "train.micro_batch_size=4", "train.eval_batches=1",
                    "precision.keep_hp=[output,unaligned]"],  # tiny's linears in FP8 all the same
            r"fp8_tensorwise vs bf16: speedup: (\d+\.\d{2})x   val loss gap: [+-]\d+\.\d{2}%"),
    "fp8_matmul": ("fp8", ["--matmul", "--sizes", "64,128"],
                   r"\s*128\s+\d+\.\d\s+\d+\.\d\s+(\d+\.\d{2})x"),
}
ELSEWHERE = {"hf": "integration/test_bench_hf.py", "sweep": "integration/test_sweep_overhead.py", "prune": "integration/test_prune_savings.py",
             "study": "integration/test_bench_study.py",
             "parallel": "distributed/test_layout_speed.py",
             "checkpoint": "distributed/test_checkpoint_cost.py", "acceptance": "distributed/test_acceptance.py",
             "estimate": "integration/test_estimate_vs_measured.py"}


DOCS = [REPO / "README.md", *sorted((REPO / "docs" / "pages").rglob("*.md"))]
"""Where a bench may be named: the README and every docs page (their bash blocks and their prose)."""


def benches_named() -> set[str]:
    """Every bench a doc names: `trainlab bench NAME` or `trainlab.bench.MODULE` (torchrun's form)."""
    name_of = {module: name for name, module in MODULES.items()}
    named = set()
    for page in DOCS:
        text = page.read_text()
        named |= set(re.findall(r"trainlab bench (\w+)", text))
        named |= {name_of.get(module, module) for module in re.findall(r"trainlab\.bench\.(\w+(?:\.\w+)*)", text)}
    return named


def test_every_bench_the_docs_name_has_a_smoke_test():
    named = benches_named()
    assert "overhead" in named and "fp8" in named, named  # the docs' own lines were read
    covered = {bench for bench, _, _ in SMOKE.values()} | set(ELSEWHERE)
    assert named <= covered, f"no smoke test for trainlab bench {sorted(named - covered)}"
    missing = [path for path in ELSEWHERE.values() if not (REPO / "tests" / path).is_file()]
    assert not missing, missing


@pytest.mark.slow  # each a fresh process that imports torch and trains: 4-18 s on 2 busy cores
@pytest.mark.parametrize("case", list(SMOKE))
def test_bench_runs_at_smoke_size_and_ends_with_its_ratio_line(case, cli_env, tmp_path):
    bench, args, ratio_line = SMOKE[case]
    proc = subprocess.run(trainlab_cmd("bench", bench, *args), cwd=tmp_path, env={**cli_env, "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=600)
    shown = f"\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, shown
    assert "Traceback" not in proc.stdout + proc.stderr, shown
    last = proc.stdout.rstrip().splitlines()[-1]
    m = re.fullmatch(ratio_line, last)
    assert m, f"the last line is not the ratio line {ratio_line!r}: {last!r}{shown}"
    ratio = float(m.group(1))
    assert math.isfinite(ratio) and ratio > 0, last
