"""The tiers' durations from pytest's JUnit reports: where the time goes, and what is in the wrong tier.

    python .ci/durations.py test-reports/gate.xml test-reports/slow.xml

Prints per report its wall time (pytest's own), the files that took longest and the slowest tests;
for the gate tier also every test over GATE_TEST_LIMIT_S, a candidate for `@pytest.mark.slow`, and
for the slow tier every test over SLOW_TEST_LIMIT_S with what it proves (its docstring's first
sentence, else its name), a candidate for a cheaper form (the whole `.ci/run` must stay under 30
minutes on 2 cores, the gate under 8).
"""

from __future__ import annotations

import ast
import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

GATE_TEST_LIMIT_S = 20.0
"""A gate test that takes longer (setup included) is reported as a candidate for the slow tier."""
SLOW_TEST_LIMIT_S = 60.0
"""A slow test that takes longer is reported with what it proves: merge it or find a cheaper form."""
REPO = Path(__file__).resolve().parents[1]


def cases(report: Path) -> tuple[float, list[tuple[str, str, float]]]:
    """(the suite's wall time, [(file, test, seconds)]) of one JUnit report."""
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    rows = []
    for case in suite.iter("testcase"):
        module = case.get("classname", "").split(".")
        file = "/".join(module[:-1] if module[-1][:1].isupper() else module) + ".py"
        rows.append((file, case.get("name", ""), float(case.get("time", 0))))
    return float(suite.get("time", 0)), rows


def proves(file: str, test: str) -> str:
    """What a test proves, in a line: its docstring's first sentence, else its name as words."""
    name = test.split("[", 1)[0]
    try:
        tree = ast.parse((REPO / file).read_text())
    except (OSError, SyntaxError):
        tree = None
    for node in ast.walk(tree) if tree else ():
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            doc = ast.get_docstring(node)
            if doc:
                first = re.split(r"(?<=\.)\s", " ".join(doc.split()), maxsplit=1)[0]
                return first if len(first) <= 160 else first[:157] + "..."
    return name.removeprefix("test_").replace("_", " ")


def show(report: Path, *, top: int = 12) -> None:
    wall, rows = cases(report)
    per_file: dict[str, float] = defaultdict(float)
    for file, _, seconds in rows:
        per_file[file] += seconds
    print(f"{report.stem}: {len(rows)} tests, {wall / 60:.1f} min wall ({sum(per_file.values()) / 60:.1f} min in tests)")
    for file, seconds in sorted(per_file.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {seconds:7.1f} s  {file}")
    print("  slowest tests:")
    for file, name, seconds in sorted(rows, key=lambda r: -r[2])[:top]:
        print(f"  {seconds:7.1f} s  {file}::{name}")
    if report.stem == "gate":
        for file, name, seconds in rows:
            if seconds > GATE_TEST_LIMIT_S:
                print(f"  over {GATE_TEST_LIMIT_S:.0f} s in the gate (mark it slow?): {seconds:.1f} s {file}::{name}")
    else:
        for file, name, seconds in sorted(rows, key=lambda r: -r[2]):
            if seconds > SLOW_TEST_LIMIT_S:
                print(f"  over {SLOW_TEST_LIMIT_S:.0f} s: {seconds:.1f} s {file}::{name}\n"
                      f"      proves: {proves(file, name)}")


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    for path in argv:
        if Path(path).is_file():
            show(Path(path))
        else:
            print(f"{path}: no report (that tier did not run)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
