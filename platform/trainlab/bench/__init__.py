"""`trainlab bench <name>`: benchmarks that print ratios measured side by side in one run."""

from __future__ import annotations

import importlib
import sys

MODULES = {
    "overhead": "engine_overhead",
    "hf": "hf_peer",
    "sweep": "sweep_overhead",
    "study": "study_search",
    "prune": "prune_savings",
    "fp8": "fp8_vs_bf16",
    "parallel": "layout_speed",
    "determinism": "determinism_cost",
    "balance": "balance_modes",
    "checkpoint": "checkpoint_cost",
    "acceptance": "acceptance.gpu_accept",
    "estimate": "estimate_accuracy.estimate_vs_measured",
}
"""Each bench's name on the command line -> its module under trainlab.bench (named for what it measures)."""
BENCHES = tuple(MODULES)


def main(argv: list[str]) -> None:
    if not argv or argv[0] not in BENCHES:
        print(f"usage: trainlab bench {{{'|'.join(BENCHES)}}} [options]  (--help for options)",
              file=sys.stderr)
        sys.exit(2)
    bench_main = importlib.import_module(f"trainlab.bench.{MODULES[argv[0]]}").main
    if argv[0] == "acceptance":
        sys.exit(bench_main(argv[1:]))  # the acceptance run returns its exit status
    bench_main(argv[1:])
