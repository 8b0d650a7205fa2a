"""The acceptance table's runs: each group of modes in one torchrun process of
trainlab.bench.fp8_vs_bf16, its rows read as they come (bench.fp8_vs_bf16 rewrites its JSON after every mode),
printed, and the report rewritten after each."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from trainlab.bench.acceptance.children import Children, error_line, tail
from trainlab.bench.acceptance.report import FINISHED
from trainlab.bench.acceptance.workload import Group


class Table:
    """The table's rows as they come: printed, and the report rewritten, after every mode."""

    def __init__(self, result: dict, *, flush, estimate_s: dict[str, float]):
        self.result, self.flush, self.estimate_s = result, flush, estimate_s

    def set(self, row: dict) -> None:
        mode = row["precision"]
        row.setdefault("est_s", self.estimate_s.get(mode))
        rows = self.result["rows"]
        rows[[r["precision"] for r in rows].index(mode)] = row
        if row["status"] == FINISHED:
            print(f"  {mode:<16} {row['tokens_per_s']:>12,.0f} tokens/s  val loss {row['val_loss']:.4f}  "
                  f"peak {row['peak_mem_gb']:.1f} GB  compile {row.get('compile_s') or 0:.1f} s  "
                  f"({row.get('mode_s') or 0:.0f} s in all)", flush=True)
        elif row["status"] != "running":
            print(f"  {mode:<16} {row['status']}", flush=True)
        self.flush()


def run_table(children: Children, groups: list[Group], *, overrides: list[str], work: Path, table: Table) -> None:
    """Each group's modes in one torchrun process; a process that ends before all its modes
    ran gives the one it was running an error row and the rest a process of their own."""
    pending = list(groups)
    while pending:
        group = pending.pop(0)
        table.set({"precision": group.modes[0], "status": "running"})
        code, output, got = _run_group(children, group.modes, overrides=overrides, work=work, table=table)
        missing = [m for m in group.modes if m not in got]
        if not missing:
            continue
        why = "out of time" if code is None else error_line(output)
        print(f"  {','.join(missing)}: no result ({why})\n{tail(output)}", flush=True)
        table.set({"precision": missing[0], "status": f"error: {why}"})
        if code is None:
            for mode in missing[1:] + [m for g in pending for m in g.modes]:
                table.set({"precision": mode, "status": "not run: out of time"})
            return
        if missing[1:]:  # they may share a process as before; the crashed mode stays out of it
            pending.insert(0, Group(missing[1:], why=f"the process ended in {missing[0]}"))


def _run_group(children: Children, modes: list[str], *, overrides: list[str], work: Path,
               table: Table) -> tuple[int | None, str, set[str]]:
    out = work / f"{'_'.join(modes).replace('+', '-')}.json"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
           "-m", "trainlab.bench.fp8_vs_bf16", "--keep-going", "--precisions", ",".join(modes), "--json", str(out),
           *overrides]
    got: set[str] = set()

    def poll() -> None:  # bench.fp8_vs_bf16 rewrites its JSON (whole) after every mode
        try:
            rows = json.loads(out.read_text())["rows"]
        except (OSError, ValueError, KeyError):
            return
        for row in rows:
            if row["precision"] not in got:
                got.add(row["precision"])
                table.set(row)
                nxt = modes.index(row["precision"]) + 1
                if nxt < len(modes) and modes[nxt] not in got:
                    table.set({"precision": modes[nxt], "status": "running"})

    code, output = children.run(f"table {','.join(modes)}", cmd, poll=poll)
    return code, output, got
