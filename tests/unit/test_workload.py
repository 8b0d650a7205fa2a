"""The GPU acceptance run's lease plan, on a CPU in seconds: what it trains on an H100/H200 and
whether that fits one lease, which modes share a process (engine.isolation's rule), and a
report that is complete after every mode."""

from __future__ import annotations

import json
import re
import sys
import textwrap
import time

import pytest

from conftest import REPO
from trainlab.bench.acceptance import gpu_accept as acc
from trainlab.bench.acceptance import gpu_tests as acc_tests
from trainlab.bench.acceptance import table_runs as acc_table
from trainlab.bench.acceptance import workload as plan_mod
from trainlab.bench.acceptance.children import Children
from trainlab.bench.acceptance.report import format_report, same_tokens, table_lines
from trainlab.bench.fp8_vs_bf16 import step_timing, watch_tokens
from trainlab.data import build_corpus
from trainlab.data.batches import num_windows

# matmul TFLOP/s at 8192^3 measured on one H200 (2026-11-27, torch 2.11.0+cu130)
H200 = {"bf16": 739.0, "fp16": 719.0, "tf32": 407.0, "fp32": 50.2, "fp8": 1391.0}
H100 = {"bf16": 620.0, "fp16": 600.0, "tf32": 350.0, "fp32": 48.0, "fp8": 1150.0}
SHAPE = dict(vocab_size=256, seq_len=2048, micro_batch=4)


def _plan(memory_gb: float, rates: dict, *, processes: int = 2, **kw) -> plan_mod.TablePlan:
    return plan_mod.plan_table(plan_mod.fitting(memory_gb, **SHAPE), plan_mod.HEADLINE_MODES,
                               processes=processes, budget_s=plan_mod.BUDGET_S - acc.REPORT_S,
                               costs=plan_mod.COSTS["cuda"], eval_batches=5, rates=rates,
                               compiled=set(plan_mod.HEADLINE_MODES), **kw)


@pytest.mark.parametrize("memory_gb,rates", [(141.0, H200), (79.6, H100)], ids=["h200", "h100"])
def test_headline_trains_1b_within_one_command_of_a_lease(memory_gb, rates):
    """1b (7b's fp32 state does not fit either), the most steps, and the whole command inside
    its budget; the lease's two commands and the machine's start inside 15 minutes."""
    table = _plan(memory_gb, rates)
    assert table.sizing.model == "1b" and table.steps == plan_mod.MAX_STEPS
    assert table.fits and table.total_s <= plan_mod.BUDGET_S - acc.REPORT_S
    # the estimate agrees with what the H200 measured (2026-11-27, second run): compiled 1b modes
    # of 40 steps and 6 validation batches took 40-43 s each (`mode s`)
    at40 = plan_mod.table_seconds(["bf16"], steps=40, eval_batches=6, sizing=table.sizing, rates=H200,
                                  costs=plan_mod.COSTS["cuda"], compiled={"bf16"})["bf16"]
    assert 40 * 0.9 <= at40 <= 43 * 1.1, at40
    lease = plan_mod.lease_commands(model=table.sizing.model, steps=table.steps, later_s=400.0,
                                    tests_select=acc.TESTS_SELECT)
    first, second = lease[:2]
    assert first["command"] == "bash .ci/gpu-accept" and second["command"] == "bash .ci/gpu-accept --parts tests"
    assert first["timeout_s"] == second["timeout_s"] == 330
    assert plan_mod.LEASE_START_S + first["timeout_s"] + second["timeout_s"] <= plan_mod.LEASE_S - 60
    later = " ".join(c["command"] for c in lease[2:])
    assert "--modes bf16,fp16,fp32+tf32,fp32 --model 1b --steps 100" in later and "multi_gpu" in later
    assert all(c["timeout_s"] <= 600 for c in lease)


def test_slower_device_trains_fewer_steps_then_a_smaller_model():
    fifth = {k: v / 5 for k, v in H200.items()}
    slow = _plan(141.0, fifth)
    assert slow.sizing.model == "1b" and plan_mod.MIN_STEPS <= slow.steps < plan_mod.MAX_STEPS and slow.fits
    slower = _plan(141.0, {k: v / 40 for k, v in H200.items()})
    assert slower.sizing.params < slow.sizing.params and slower.fits
    hopeless = _plan(141.0, {k: v / 10_000 for k, v in H200.items()})
    assert hopeless.sizing.model == plan_mod.PRESETS[-1] and hopeless.steps == plan_mod.MIN_STEPS
    assert not hopeless.fits  # the caller warns; the deadline cuts what runs past it


def test_fit_steps_takes_the_most_steps_that_fit():
    kw = dict(eval_batches=5, sizing=plan_mod.size_of("1b", **SHAPE), rates={k: v / 10 for k, v in H200.items()},
              costs=plan_mod.COSTS["cuda"], compiled=set(plan_mod.HEADLINE_MODES))
    modes = plan_mod.HEADLINE_MODES
    for budget in (200.0, 260.0, 320.0):
        steps = plan_mod.fit_steps(modes, budget_s=budget, max_steps=1000, min_steps=5, **kw)
        assert sum(plan_mod.table_seconds(modes, steps=steps, **kw).values()) <= budget
        assert sum(plan_mod.table_seconds(modes, steps=steps + 1, **kw).values()) > budget


def test_table_data_holds_the_headline_batches():
    """TABLE_DATA's corpus has room for the table's windows of 2048 tokens: several validation
    batches of 4, and MAX_STEPS batches within about two passes."""
    run = acc.mode_configs(acc.base_overrides(device="cpu", extra=[]), ["bf16"])["bf16"]
    corpus = build_corpus(run.data)
    assert corpus.vocab_size == 256 and corpus.name == "text"
    assert num_windows(len(corpus.val), 2048) // 4 >= 4
    assert plan_mod.MAX_STEPS * 4 / num_windows(len(corpus.train), 2048) <= 2.1


def _headline_configs(device: str, extra: list[str] = ()) -> dict:
    base = acc.base_overrides(device=device, extra=list(extra))
    return acc.mode_configs(base, plan_mod.run_order([*plan_mod.HEADLINE_MODES, "fp16"]))


def test_modes_share_a_process_where_fresh_gang_reason_allows():
    """On CUDA a compiled non-torchao mode after a torchao FP8 one needs a fresh process (the
    patched inductor); on CPU every mode may follow any other."""
    cuda = plan_mod.group_modes(_headline_configs("cuda"), device="cuda")
    assert [g.modes for g in cuda] == [["bf16", "fp8_tensorwise", "fp8_rowwise"], ["fp8_delayed", "fp16"]]
    assert cuda[0].why == "" and "fp8_delayed" in cuda[1].why and "inductor" in cuda[1].why
    cpu = plan_mod.group_modes(_headline_configs("cpu"), device="cpu")
    assert [g.modes for g in cpu] == [["bf16", "fp8_tensorwise", "fp8_rowwise", "fp8_delayed", "fp16"]]


def test_grouping_asks_engine_isolation(monkeypatch):
    """The rule is engine.isolation's, called, not copied: a reason for everything, a process each."""
    import trainlab.engine.isolation as isolation

    asked = []
    monkeypatch.setattr(isolation, "fresh_gang_reason",
                        lambda *, ran, run, device: asked.append(run.precision.name) or "fresh gang: told so")
    groups = plan_mod.group_modes(_headline_configs("cpu"), device="cpu")
    assert [g.modes for g in groups] == [[m] for m in ("bf16", "fp8_tensorwise", "fp8_rowwise", "fp8_delayed", "fp16")]
    assert groups[1].why == "told so" and "fp16" in asked


# ---- the report ------------------------------------------------------------------------------
def _row(mode: str, **kw) -> dict:
    row = {"precision": mode, "status": "finished", "tokens_per_s": 60_000.0, "est_tokens_per_s": 50_000.0,
           "mfu": 0.45, "mfu_fp8": None, "val_loss": 2.0, "peak_mem_gb": 30.0, "est_peak_mem_gb": 40.0,
           "compile": True, "compile_unit": "block", "fp8_layers": None, "compile_s": 12.5, "mode_s": 33.0,
           "est_s": 38.0, "tokens_seen": 819_200, "data_sha256": "ab" * 32}
    return row | kw


def _result(rows: list[dict]) -> dict:
    env = {"device": "NVIDIA H200", "gpus": 1, "torch": "2.11.0+cu130", "torchao": "0.18.0", "device_type": "cuda"}
    plan = {"model": "1b", "params": 974e6, "data": "text corpus", "steps": 100, "micro_batch": 4, "seq_len": 2048,
            "groups": [{"modes": [r["precision"] for r in rows], "why": ""}], "tests_select": acc.TESTS_SELECT}
    return {"env": env, "plan": plan, "rows": rows, "wall_s": 200.0, "targets": []}


def test_report_rows_say_compiled_fp8_layers_tokens_and_measured_over_estimated():
    rows = [_row("bf16"), _row("fp8_tensorwise", tokens_per_s=75_000.0, fp8_layers="112/113"),
            _row("fp32", compile=False, compile_unit="", compile_s=0.4)]
    lines = table_lines(_result(rows))
    header, bf16, fp8, fp32 = (line.split() for line in lines)
    assert header[:3] == ["mode", "compiled", "fp8"]
    assert bf16[:3] == ["bf16", "block", "-"] and fp8[:3] == ["fp8_tensorwise", "block", "112/113"]
    assert fp32[1] == "no"  # an eager row reads "no" (a stored 'false' string used to read "yes")
    assert bf16[3:6] == ["60,000", "50,000", "1.20"]  # tokens/s, estimate, measured / estimated
    assert bf16[10:13] == ["30.00", "40.00", "0.75"]  # peak GB, estimate, ratio
    assert bf16[13:17] == ["12.5", "33", "38", "0.87"]  # compile s, mode s, estimate, ratio
    assert fp8[9] == "+0.00%" and all(r[-2:] == ["same", "finished"] for r in (bf16, fp8, fp32))
    assert same_tokens(rows)[1].startswith("tokens: all 3 finished modes saw the same 819,200 training tokens")


def test_report_names_rows_that_saw_other_tokens():
    rows = [_row("bf16"), _row("fp8_rowwise", data_sha256="cd" * 32)]
    ok, line = same_tokens(rows)
    assert ok is False and line.startswith("tokens DIFFER") and "cdcdcdcd" in line
    assert table_lines(_result(rows))[2].split()[-2] == "DIFFER"


def test_report_keeps_unfinished_rows_and_ends_with_the_ratio_line():
    rows = [_row("bf16"), _row("fp8_tensorwise", tokens_per_s=75_000.0),
            {"precision": "fp8_delayed", "status": "error: InductorError: boom", "compile": True,
             "compile_unit": "block", "est_s": 37.0}, {"precision": "fp16", "status": "pending"}]
    report = format_report(_result(rows))
    assert re.search(r"^fp8_delayed\s+block( +-)+ +37 .*error: InductorError: boom$", report, re.M)
    assert re.search(r"^fp16\s+-( +-)+ +pending$", report, re.M)
    assert report.splitlines()[-1] == "fp8/bf16: 1.25x"


# ---- after every mode ------------------------------------------------------------------------
class FakeChildren:
    """Children that 'run' bench.fp8_vs_bf16 by writing its --json rows one mode at a time, polling between."""

    def __init__(self, *, fail_after: dict[str, tuple[int | None, str]] | None = None):
        self.calls: list[list[str]] = []
        self.seen_between: list[str] = []
        self.fail_after = fail_after or {}
        self.out = None

    def run(self, title, cmd, *, poll=None, **kw):
        modes = cmd[cmd.index("--precisions") + 1].split(",")
        path = cmd[cmd.index("--json") + 1]
        self.calls.append(modes)
        rows = []
        for mode in modes:
            if mode in self.fail_after:
                return self.fail_after[mode]
            rows.append(_row(mode))
            with open(path, "w") as f:
                json.dump({"rows": rows}, f)
            poll()
            self.seen_between.append((self.out / "acceptance.txt").read_text())
        return 0, ""


def _table_run(tmp_path, children: FakeChildren, groups: list[list[str]]) -> dict:
    from trainlab.bench.acceptance.report import write_report

    modes = [m for g in groups for m in g]
    result = _result([{"precision": m, "status": "pending"} for m in modes])
    children.out = tmp_path
    table = acc_table.Table(result, flush=lambda: write_report(tmp_path, result), estimate_s={m: 30.0 for m in modes})
    acc_table.run_table(children, [plan_mod.Group(g) for g in groups], overrides=[], work=tmp_path, table=table)
    return result


def test_report_is_rewritten_after_every_mode(tmp_path):
    children = FakeChildren()
    _table_run(tmp_path, children, [["bf16", "fp8_tensorwise"], ["fp8_delayed"]])
    first, second, third = children.seen_between
    assert re.search(r"^bf16 .* finished$", first, re.M) and re.search(r"^fp8_tensorwise .* running$", first, re.M)
    assert re.search(r"^fp8_delayed .* pending$", first, re.M)
    assert re.search(r"^fp8_tensorwise .* finished$", second, re.M)
    assert re.search(r"^fp8_delayed .* finished$", third, re.M)
    saved = json.loads((tmp_path / "acceptance.json").read_text())
    assert [r["status"] for r in saved["rows"]] == ["finished"] * 3


def test_a_crashed_process_costs_its_mode_only(tmp_path):
    """The mode that was running gets the error; the modes after it a process of their own."""
    children = FakeChildren(fail_after={"fp8_tensorwise": (1, "[rank0]: RuntimeError: Triton boom")})
    result = _table_run(tmp_path, children, [["bf16", "fp8_tensorwise", "fp8_rowwise"]])
    assert children.calls == [["bf16", "fp8_tensorwise", "fp8_rowwise"], ["fp8_rowwise"]]
    assert [r["status"] for r in result["rows"]] == ["finished", "error: RuntimeError: Triton boom", "finished"]


def test_out_of_time_stops_the_table_and_says_so(tmp_path):
    children = FakeChildren(fail_after={"fp8_tensorwise": (None, "")})
    result = _table_run(tmp_path, children, [["bf16", "fp8_tensorwise", "fp8_rowwise"], ["fp8_delayed"]])
    assert children.calls == [["bf16", "fp8_tensorwise", "fp8_rowwise"]]
    assert [r["status"] for r in result["rows"]] == ["finished", "error: out of time", "not run: out of time",
                                                     "not run: out of time"]
    assert "not run: out of time" in (tmp_path / "acceptance.txt").read_text()


# ---- the child's measurements ----------------------------------------------------------------
def test_step_timing_takes_compile_from_the_first_step_and_eval_from_the_last():
    marks = [10.0 + 12.0, 22.5, 23.0, 23.5, 24.0, 27.0]  # start 10: a 12 s first step, 0.5 s steps, 3 s last
    t = step_timing(10.0, marks)
    assert t["step_s"] == pytest.approx(0.5) and t["compile_s"] == pytest.approx(11.5)
    assert t["eval_s"] == pytest.approx(2.5) and t["first_step_s"] == pytest.approx(12.0)
    assert step_timing(0.0, [1.0])["compile_s"] is None


def test_token_digest_covers_validation_and_every_drawn_batch():
    import torch

    class Batches:
        def __init__(self, seed):
            self.g = torch.Generator().manual_seed(seed)

        def next_step(self):
            return [(torch.randint(0, 9, (2, 4), generator=self.g), torch.randint(0, 9, (2, 4), generator=self.g))]

    class Trainer:
        def __init__(self, seed):
            self.val, self.batches = [(torch.zeros(2, 4, dtype=torch.long),) * 2], Batches(seed)

    digests = []
    for seed in (1, 1, 2):
        trainer = Trainer(seed)
        digest = watch_tokens(trainer)
        for _ in range(3):
            trainer.batches.next_step()
        digests.append(digest.hexdigest())
    assert digests[0] == digests[1] != digests[2]


# ---- processes and pytest under a deadline --------------------------------------------------------
@pytest.mark.slow  # real child processes and their grace periods
def test_children_interrupt_before_kill_and_poll_while_running(tmp_path):
    script = textwrap.dedent("""
        import sys, time
        print("started", flush=True)
        try:
            time.sleep(60)
        except KeyboardInterrupt:
            print("interrupted: writing the summary", flush=True)
    """)
    children = Children(log=tmp_path / "log", env=None, deadline=time.monotonic() + 60, cwd=tmp_path)
    polls = []
    t0 = time.monotonic()
    code, output = children.run("sleeper", [sys.executable, "-c", script], poll=lambda: polls.append(1),
                                deadline=time.monotonic() + 10, interrupt_s=10)  # a Python start: < 1 s
    assert code is None and time.monotonic() - t0 < 30  # the deadline, then SIGINT ends it at once
    assert "started" in output and "interrupted: writing the summary" in output
    assert len(polls) >= 2 and "interrupted" in (tmp_path / "log").read_text()


@pytest.mark.slow  # a real pytest child under a deadline
def test_pytest_under_a_deadline_keeps_names_reasons_and_xml(tmp_path, capsys):
    """tests/gpu/conftest.py's reason lines come as failures happen; SIGINT at the deadline lets
    pytest write its summary and JUnit XML."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text((REPO / "tests" / "gpu" / "conftest.py").read_text())
    (suite / "test_lease.py").write_text(textwrap.dedent("""
        import time
        def test_passes(): pass
        def test_fails(): assert 1 + 1 == 3, "arithmetic is off"
        def test_hangs(): time.sleep(120)
    """))
    children = Children(log=tmp_path / "log", env=None, deadline=time.monotonic() + 120, cwd=tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    # the deadline far above pytest's start and two tests (1-3 s idle, ~8 s on a loaded 2-core machine)
    tests = acc.run_tests(children, select="not nothing", out=out, deadline=time.monotonic() + 20,
                          path=str(suite), cwd=tmp_path)
    echoed = capsys.readouterr().out
    assert "test_lease.py::test_fails FAILED" in echoed  # echoed as it came
    assert tests["exit_code"] is None and tests["summary"].endswith("(stopped at the deadline: test_lease.py)")
    assert "1 failed, 1 passed" in tests["summary"]
    (reason,) = [f for f in tests["failed"] if f.startswith("-> FAILED")]
    assert "test_lease.py::test_fails" in reason and "arithmetic is off" in reason
    assert tests["junit"] and 'name="test_fails"' in (out / "gpu-tests.xml").read_text()


def test_each_gpu_test_module_runs_in_a_process_of_its_own(tmp_path):
    """A module that leaves state behind in the process (as torchao's inductor patch does) cannot
    change the next module's results; the modules' reports are merged into one JUnit file."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text((REPO / "tests" / "gpu" / "conftest.py").read_text())
    (suite / "test_a_patches.py").write_text(textwrap.dedent("""
        import json
        def test_patches_the_process(): json.PATCHED_BY_A = True
    """))
    (suite / "test_b_needs_a_clean_process.py").write_text(textwrap.dedent("""
        import json
        def test_sees_no_patch(): assert not hasattr(json, "PATCHED_BY_A"), "module a's state leaked"
    """))
    children = Children(log=tmp_path / "log", env=None, deadline=time.monotonic() + 120, cwd=tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    tests = acc.run_tests(children, select="not nothing", out=out, deadline=time.monotonic() + 100,
                          path="suite", cwd=tmp_path)
    assert tests["exit_code"] == 0 and tests["summary"] == "2 passed", tests
    xml = (out / "gpu-tests.xml").read_text()
    assert 'name="test_patches_the_process"' in xml and 'name="test_sees_no_patch"' in xml
    assert sorted(p.name for p in out.iterdir()) == ["gpu-tests.xml"]  # the per-module reports merged, removed


def test_junit_merge_reads_only_regular_files_within_its_bound(tmp_path, monkeypatch, capsys):
    good, big, folder = tmp_path / "good.xml", tmp_path / "big.xml", tmp_path / "folder.xml"
    good.write_text('<testsuites><testsuite name="a" tests="1"><testcase name="t_a"/></testsuite></testsuites>')
    big.write_text('<testsuite name="b" tests="1"><testcase name="t_b"/></testsuite>' + "<!-- padding -->" * 20)
    folder.mkdir()
    monkeypatch.setattr(acc_tests, "JUNIT_MAX_BYTES", good.stat().st_size)
    acc_tests.merge_junit([good, big, folder], tmp_path / "merged.xml")
    merged = (tmp_path / "merged.xml").read_text()
    assert 'name="t_a"' in merged and 't_b' not in merged
    said = capsys.readouterr().out
    assert "big.xml: not a regular file" in said and "folder.xml: not a regular file" in said
