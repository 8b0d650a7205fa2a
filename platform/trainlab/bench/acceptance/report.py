"""The acceptance run's report: the table, issue 15's targets, and `fp8/bf16: X.XXx` last.

`write_report` is called after every mode and part, so a command cut at its limit still
leaves acceptance.txt and acceptance.json with every row it finished."""

from __future__ import annotations

import json
from pathlib import Path

from trainlab import names
from trainlab.bench.acceptance.workload import LEASE_S, LEASE_START_S

FP8_SPEEDUP_TARGET = 1.2
"""fp8_tensorwise tokens/s over bf16's, on the largest preset that fits one H100/H200."""
VAL_LOSS_GAP_TARGET = 0.01
"""|fp8_tensorwise val loss - bf16's| / bf16's, on the same tokens."""
BF16_MFU_TARGET = 0.40
OVERHEAD_TARGET = 0.97
"""Engine tokens/s over a bare loop's."""
FINISHED = names.STATUS_FINISHED


def _row(result: dict, mode: str) -> dict | None:
    row = next((r for r in result["rows"] if r["precision"] == mode), None)
    return row if row and row.get("status") == FINISHED else None


def fp8_over_bf16(result: dict) -> float | None:
    fp8, bf16 = _row(result, "fp8_tensorwise"), _row(result, "bf16")
    return fp8["tokens_per_s"] / bf16["tokens_per_s"] if fp8 and bf16 else None


def targets(result: dict, *, gpu: bool) -> list[dict]:
    """Each target with its measured value and verdict: pass / FAIL on a GPU, '-' elsewhere
    (the targets are for one H100/H200) or where it was not measured."""
    fp8, bf16 = _row(result, "fp8_tensorwise"), _row(result, "bf16")
    speedup = fp8_over_bf16(result)
    gap = (fp8["val_loss"] - bf16["val_loss"]) / bf16["val_loss"] if fp8 and bf16 else None
    mfu = bf16.get("mfu") if bf16 else None
    ratio = (result.get("overhead") or {}).get("ratio")
    rows = [
        (f"fp8_tensorwise >= {FP8_SPEEDUP_TARGET}x bf16 tokens/s", speedup,
         None if speedup is None else speedup >= FP8_SPEEDUP_TARGET, lambda v: f"{v:.2f}x"),
        (f"fp8_tensorwise val loss within {VAL_LOSS_GAP_TARGET:.0%} of bf16", gap,
         None if gap is None else abs(gap) <= VAL_LOSS_GAP_TARGET, lambda v: f"{100 * v:+.2f}%"),
        (f"bf16 MFU >= {BF16_MFU_TARGET:.0%}", mfu, None if mfu is None else mfu >= BF16_MFU_TARGET,
         lambda v: f"{100 * v:.1f}%"),
        (f"engine vs bare loop >= {OVERHEAD_TARGET}", ratio,
         None if ratio is None else ratio >= OVERHEAD_TARGET, lambda v: f"{v:.3f}"),
    ]
    return [{"target": name, "value": value, "shown": "-" if value is None else fmt(value),
             "verdict": "-" if ok is None or not gpu else ("pass" if ok else "FAIL")}
            for name, value, ok, fmt in rows]


def ratio(measured: float | None, estimated: float | None) -> float | None:
    """measured / estimated; None where either is missing (or the estimate is 0)."""
    return measured / estimated if measured is not None and estimated else None


def same_tokens(rows: list[dict]) -> tuple[bool | None, str]:
    """Whether every finished row saw the same tokens (tokens_seen and the sha256 of its
    batches, bench.fp8_vs_bf16's data_sha256), and a line that says so."""
    done = [r for r in rows if r.get("status") == FINISHED]
    if not done:
        return None, "tokens: no finished mode"
    seen = {(r["tokens_seen"], r.get("data_sha256")) for r in done}
    if len(seen) == 1:
        (tokens, sha), = seen
        how = (f"sha256 of every training and validation batch {sha[:16]}" if sha
               else "no batch checksum: the same data config, seed and steps")
        return True, (f"tokens: all {len(done)} finished modes saw the same {tokens:,} training tokens in "
                      f"the same order ({how})")
    return False, "tokens DIFFER: " + "; ".join(
        f"{r['precision']} {r['tokens_seen']:,} ({(r.get('data_sha256') or '-')[:16]})" for r in done)


def _f(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


COLUMNS = (("mode", "<15"), ("compiled", ">8"), ("fp8 lin.", ">8"), ("tokens/s", ">9"), ("est", ">9"),
           ("m/e", ">5"), ("MFU", ">6"), ("MFU fp8", ">7"), ("val loss", ">8"), ("vs bf16", ">7"),
           ("peak GB", ">7"), ("est", ">6"), ("m/e", ">5"), ("compile s", ">9"), ("mode s", ">6"),
           ("est", ">5"), ("m/e", ">5"), ("tokens", ">7"))
"""The table's columns: est = the estimate beside the measurement before it, m/e = their
ratio (trainlab.estimate's for tokens/s and peak GB, the plan's for the mode's seconds)."""


def table_lines(result: dict) -> list[str]:
    rows = result["rows"]
    ref = _row(result, "bf16")
    tokens_ok, _ = same_tokens(rows)
    first = next((r for r in rows if r.get("status") == FINISHED), None)
    lines = [" ".join(format(name, spec) for name, spec in COLUMNS) + "  status"]
    for r in rows:
        unit = r.get("compile_unit") or "yes"
        compiled = "-" if "compile" not in r else (unit if r["compile"] is True else "no")
        if r.get("status") != FINISHED:
            cells = [r["precision"], compiled] + ["-"] * (len(COLUMNS) - 2)
            cells[14:16] = [_f(r.get("mode_s"), ".0f"), _f(r.get("est_s"), ".0f")]
            lines.append(" ".join(format(c, spec) for c, (_, spec) in zip(cells, COLUMNS)) + f"  {r['status']}")
            continue
        gap = f"{100 * (r['val_loss'] - ref['val_loss']) / ref['val_loss']:+.2f}%" if ref else "-"
        same = "same" if tokens_ok or (first and (r["tokens_seen"], r.get("data_sha256")) ==
                                       (first["tokens_seen"], first.get("data_sha256"))) else "DIFFER"
        cells = [r["precision"], compiled, r.get(names.TAG_FP8_LAYERS) or "-",
                 _f(r["tokens_per_s"], ",.0f"), _f(r.get("est_tokens_per_s"), ",.0f"),
                 _f(ratio(r["tokens_per_s"], r.get("est_tokens_per_s")), ".2f"),
                 _pct(r.get("mfu")), _pct(r.get("mfu_fp8")), _f(r["val_loss"], ".4f"), gap,
                 _f(r["peak_mem_gb"], ".2f"), _f(r.get("est_peak_mem_gb"), ".2f"),
                 _f(ratio(r["peak_mem_gb"], r.get("est_peak_mem_gb")), ".2f"), _f(r.get("compile_s"), ".1f"),
                 _f(r.get("mode_s"), ".0f"), _f(r.get("est_s"), ".0f"),
                 _f(ratio(r.get("mode_s"), r.get("est_s")), ".2f"), same]
        lines.append(" ".join(format(c, spec) for c, (_, spec) in zip(cells, COLUMNS)) + f"  {r['status']}")
    return lines


def format_report(result: dict) -> str:
    env, plan = result["env"], result["plan"]
    lines = [f"== GPU acceptance: {env['device']} x{env['gpus'] or 1}, torch {env['torch']}, "
             f"torchao {env['torchao']}, {result['wall_s']:.0f} s =="]
    if result["rows"]:
        gpu = env["device_type"] == "cuda"
        lines.append(f"model {plan['model']} ({plan['params'] / 1e6:,.3g}M params), {plan['data']}, "
                     f"{plan['steps']} steps x {plan['micro_batch']} x {plan['seq_len']} tokens, same seed "
                     f"and tokens for every mode; processes: {plan_processes(plan)}")
        lines += table_lines(result)
        lines.append(same_tokens(result["rows"])[1])
        lines.append("tokens/s and MFU: medians over the steps after the first; compile s: the first step "
                     "over a steady one (torch.compile, first allocations); mode s: build + train + validate "
                     "in its process; est: trainlab.estimate (tokens/s, GB) and this plan (s); m/e: measured "
                     "/ estimated; peak GB: " + ("the most device memory allocated" if gpu
                                                 else "the process's largest resident set (CPU)"))
    overhead = result.get("overhead")
    if overhead is not None:
        model = next((o.split("=")[1] for o in overhead["overrides"] if o.startswith("model=")), "?")
        shown = f"{overhead['ratio']:.3f}" if "ratio" in overhead else overhead["status"]
        lines.append(f"overhead (engine / bare loop, model {model}, tracking=none, both "
                     f"{overhead.get('compiled') or '?'}): {shown}")
    if result.get("tests") is not None:
        tests = result["tests"]
        lines.append(f"tests/gpu (-m '{plan['tests_select']}'): {tests['summary']}"
                     + (f"; JUnit XML {tests['junit']}" if tests.get("junit") else ""))
        lines.extend(f"  {line[:300]}" for line in tests["failed"])
    lines += lease_lines(result.get("lease") or [])
    lines.append("targets (issue 15, one H100/H200):")
    lines.extend(f"  {t['target']:<46} {t['shown']:>9}  {t['verdict']}" for t in result.get("targets", []))
    speedup = fp8_over_bf16(result)
    lines.append(f"fp8/bf16: {speedup:.2f}x" if speedup is not None
                 else "fp8/bf16: n/a (no finished bf16 and fp8_tensorwise rows)")
    return "\n".join(lines)


def plan_processes(plan: dict) -> str:
    """'[bf16, fp8_tensorwise] [fp8_delayed: fresh, why]': the table's torchrun processes."""
    return " ".join(f"[{', '.join(g['modes'])}{': fresh, ' + g['why'] if g.get('why') else ''}]"
                    for g in plan.get("groups", []))


def lease_lines(lease: list[dict]) -> list[str]:
    """The commands a lease of the GPU machine runs, each with its device-tool timeout_s."""
    if not lease:
        return []
    out = ["lease plan (give the device tool each command with its timeout_s):"]
    out += [f"  {c['when']:<5} timeout_s {c['timeout_s']:>3}  {c['command']}  # {c['what']}" for c in lease]
    first = [c["timeout_s"] for c in lease if c["when"] != "later"]
    out.append(f"  one lease: start ~{LEASE_START_S:.0f} s + {' + '.join(map(str, first))} s = "
               f"{LEASE_START_S + sum(first):.0f} s of {LEASE_S:.0f}; the later commands in a lease of their own")
    return out


def write_report(out: Path, result: dict) -> str:
    """acceptance.txt and acceptance.json in `out`, as they stand now; returns the text."""
    report = format_report(result)
    for name, text in (("acceptance.txt", report + "\n"),
                       ("acceptance.json", json.dumps(result, indent=1, default=str) + "\n")):
        part = out / f"{name}.part"
        part.write_text(text)
        part.replace(out / name)  # whole or not at all, should the command be cut while writing
    return report
