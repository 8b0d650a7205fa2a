"""The acceptance run's tests part: tests/gpu, one pytest process per test module.

Why a process per module: on the first H200 run (2026-11-27) every GPU test ran in one pytest
process, and the estimate-memory and unknown-GPU tests failed after test_gpu_engine's dozen
compiled trials (FP8 among them, whose torchao conversion patches inductor for the rest of the
process: engine.isolation's rule), while each passed when run in a process of its own. The
engine gives trials on one GPU a fresh process where that rule says so; the tests get the same.

Each module runs under what is left of the deadline (SIGINT first, so pytest still writes its
summary and JUnit XML), its output echoed as it comes (tests/gpu/conftest.py prints each
failure's reason under its name); the modules' reports are merged into one JUnit file after each
module, so a command cut at its limit still returns every finished module's results.
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

from trainlab.bench.acceptance.children import Children, error_line

PYTEST_INTERRUPT_S = 10.0
"""From pytest's SIGINT at the deadline to SIGKILL: it writes its summary and XML in between."""
JUNIT_MAX_BYTES = 16 << 20
"""A module's JUnit report read back at most this big (the device tool returns 16 MiB a file)."""
OUTCOMES = ("failed", "passed", "skipped", "deselected", "xfailed", "xpassed", "error", "errors")
_COUNT = re.compile(r"(\d+) (" + "|".join(OUTCOMES) + r")\b")


def modules(path: Path) -> list[Path]:
    """The test modules under `path`, in pytest's own (name) order."""
    return sorted(path.glob("test_*.py"))


def counts(summary_line: str) -> Counter:
    """'1 failed, 2 passed in 3.0s' -> Counter(failed=1, passed=2); 'error' and 'errors' as one."""
    got = Counter()
    for n, outcome in _COUNT.findall(summary_line):
        got["errors" if outcome == "error" else outcome] += int(n)
    return got


def summary_of(total: Counter) -> str:
    return ", ".join(f"{total[k]} {k}" for k in OUTCOMES if total.get(k))


def merge_junit(parts: list[Path], into: Path) -> None:
    """One <testsuites> of every module's <testsuite>, written whole (replacing `into`)."""
    root = ET.Element("testsuites")
    for part in parts:
        if not part.is_file() or part.stat().st_size > JUNIT_MAX_BYTES:
            print(f"  {part.name}: not a regular file of at most {JUNIT_MAX_BYTES >> 20} MiB; left out", flush=True)
            continue
        try:
            tree = ET.parse(part)
        except (ET.ParseError, OSError):  # a module killed before it wrote its report
            continue
        top = tree.getroot()
        root.extend(top.findall("testsuite") if top.tag == "testsuites" else [top])
    ET.ElementTree(root).write(into, encoding="utf-8", xml_declaration=True)


def run_tests(children: Children, *, select: str, out: Path, deadline: float, path: str = "tests/gpu",
              cwd: Path) -> dict:
    """pytest -m `select` on each module of `path` in a process of its own, until `deadline`."""
    junit, parts = out / "gpu-tests.xml", []
    total, failed, stopped = Counter(), [], []
    for module in modules(cwd / path):
        part = out / f".gpu-tests-{module.stem}.xml"
        cmd = [sys.executable, "-m", "pytest", str(module.relative_to(cwd)), "-m", select, "-v",
               "-p", "no:cacheprovider", "-rfEs", f"--junitxml={part}"]
        code, output = children.run(f"tests {module.name}", cmd, cwd=cwd, echo=True, deadline=deadline,
                                    interrupt_s=PYTEST_INTERRUPT_S)
        if output.startswith("not started"):
            stopped.append(module.name)
            continue
        lines = output.splitlines()
        summary = [line for line in lines if _COUNT.search(line) and line.startswith("=")]
        if summary:
            total += counts(summary[-1])
        elif code not in (0, 5):  # no summary: a crash before pytest could count (import, collection)
            total["errors"] += 1
            failed.append(f"-> ERROR {module.name}: {error_line(output)}")
        # each failure with its reason as it happened (the conftest's '  -> ' lines), then what
        # only pytest's summary names (a module that failed to import)
        reasons = [line.strip() for line in lines if line.startswith("  -> ")]
        listed = [line for line in lines if line.startswith(("FAILED ", "ERROR "))]
        failed += reasons + [line for line in listed if not any(f" {line.split()[1]}:" in r for r in reasons)]
        if code is None:
            stopped.append(module.name)
        if part.is_file():
            parts.append(part)
            merge_junit(parts, junit)
    for part in parts:
        part.unlink(missing_ok=True)
    text = summary_of(total) or "no tests ran"
    if stopped:
        text += f" (stopped at the deadline: {', '.join(stopped)})"
    print(f"  tests/gpu: {text}", flush=True)
    return {"exit_code": None if stopped else int(bool(total["failed"] or total["errors"])),
            "summary": text, "failed": failed, "junit": str(junit) if junit.is_file() else None}
