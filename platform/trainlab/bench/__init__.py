"""`trainlab bench <name>`: benchmarks that print ratios measured side by side in one run."""

from __future__ import annotations

import sys

BENCHES = ("overhead", "sweep", "prune", "fp8", "parallel", "determinism", "balance", "checkpoint",
           "acceptance", "estimate")


def main(argv: list[str]) -> None:
    if not argv or argv[0] not in BENCHES:
        print(f"usage: trainlab bench {{{'|'.join(BENCHES)}}} [options]  (--help for options)",
              file=sys.stderr)
        sys.exit(2)
    if argv[0] == "overhead":
        from trainlab.bench.engine_overhead import main as overhead_main

        overhead_main(argv[1:])
    elif argv[0] == "sweep":
        from trainlab.bench.sweep_overhead import main as sweep_main

        sweep_main(argv[1:])
    elif argv[0] == "prune":
        from trainlab.bench.prune_savings import main as prune_main

        prune_main(argv[1:])
    elif argv[0] == "fp8":
        from trainlab.bench.fp8_vs_bf16 import main as fp8_main

        fp8_main(argv[1:])
    elif argv[0] == "parallel":
        from trainlab.bench.layout_speed import main as parallel_main

        parallel_main(argv[1:])
    elif argv[0] == "determinism":
        from trainlab.bench.determinism_cost import main as determinism_main

        determinism_main(argv[1:])
    elif argv[0] == "balance":
        from trainlab.bench.balance_modes import main as balance_main

        balance_main(argv[1:])
    elif argv[0] == "checkpoint":
        from trainlab.bench.checkpoint_cost import main as checkpoint_main

        checkpoint_main(argv[1:])
    elif argv[0] == "acceptance":
        from trainlab.bench.acceptance.gpu_accept import main as acceptance_main

        sys.exit(acceptance_main(argv[1:]))
    elif argv[0] == "estimate":
        from trainlab.bench.estimate_accuracy.estimate_vs_measured import main as estimate_main

        estimate_main(argv[1:])
