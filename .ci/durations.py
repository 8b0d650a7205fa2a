"""The tiers' durations from pytest's JUnit reports: where the time goes, and what is in the wrong tier.

    python .ci/durations.py test-reports/gate.xml test-reports/slow.xml

Prints per report its wall time (pytest's own), the files that took longest and the slowest tests;
for the gate tier also every test over GATE_TEST_LIMIT_S, a candidate for `@pytest.mark.slow`
(the gate must stay under 15 minutes on 2 cores, install included).
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

GATE_TEST_LIMIT_S = 20.0
"""A gate test that takes longer (setup included) is reported as a candidate for the slow tier."""


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
        over = [r for r in rows if r[2] > GATE_TEST_LIMIT_S]
        for file, name, seconds in over:
            print(f"  over {GATE_TEST_LIMIT_S:.0f} s in the gate (mark it slow?): {seconds:.1f} s {file}::{name}")


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
