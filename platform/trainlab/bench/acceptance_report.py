"""The acceptance run's report: the table, issue 15's targets, and `fp8/bf16: X.XXx` last."""

from __future__ import annotations

FP8_SPEEDUP_TARGET = 1.2
"""fp8_tensorwise tokens/s over bf16's, on the largest preset that fits one H100/H200."""
VAL_LOSS_GAP_TARGET = 0.01
"""|fp8_tensorwise val loss - bf16's| / bf16's, on the same tokens."""
BF16_MFU_TARGET = 0.40
OVERHEAD_TARGET = 0.97
"""Engine tokens/s over a bare loop's."""


def _row(result: dict, mode: str) -> dict | None:
    row = next((r for r in result["rows"] if r["precision"] == mode), None)
    return row if row and row.get("status") == "finished" else None


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


def _est(row: dict, key: str, spec: str) -> str:
    """trainlab.estimate's number for the row, beside what it measured ('-' where none)."""
    return format(row[key], spec) if row.get(key) is not None else "-"


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def format_report(result: dict) -> str:
    env, plan = result["env"], result["plan"]
    lines = [f"== GPU acceptance: {env['device']} x{env['gpus'] or 1}, torch {env['torch']}, "
             f"torchao {env['torchao']}, {result['wall_s']:.0f} s =="]
    if result["rows"]:
        lines.append(f"model {plan['model']} ({plan['params'] / 1e6:,.3g}M params), "
                     f"markov vocab {plan['vocab']}, "
                     f"{plan['steps']} steps x {plan['micro_batch']} x {plan['seq_len']} tokens, same seed "
                     "and tokens for every mode; tokens/s and MFU are medians over steps after the first; "
                     + ("peak GB: the most device memory allocated" if env["device_type"] == "cuda"
                        else "peak GB: the process's largest resident set (CPU)"))
        ref = _row(result, "bf16")
        width = max(len(str(r.get("device", env["device"]))) for r in result["rows"])
        lines.append(f"{'device':<{width}}  {'mode':<15} {'compile':>7} {'tokens/s':>11} {'MFU':>6} "
                     f"{'MFU fp8':>7} {'val loss':>9} {'vs bf16':>8} {'peak GB':>8} {'est tok/s':>10} "
                     f"{'est GB':>7}  status")
        for r in result["rows"]:
            if r.get("status") != "finished":
                compiled = "yes" if r.get("compile") else "no"
                lines.append(f"{env['device']:<{width}}  {r['precision']:<15} {compiled:>7} "
                             f"{'-':>11} {'-':>6} {'-':>7} {'-':>9} {'-':>8} {'-':>8} {'-':>10} {'-':>7}  "
                             f"{r['status']}")
                continue
            gap = f"{100 * (r['val_loss'] - ref['val_loss']) / ref['val_loss']:+.2f}%" if ref else "-"
            lines.append(f"{r['device']:<{width}}  {r['precision']:<15} {'yes' if r['compile'] else 'no':>7} "
                         f"{r['tokens_per_s']:>11,.0f} {_pct(r['mfu']):>6} {_pct(r['mfu_fp8']):>7} "
                         f"{r['val_loss']:>9.4f} {gap:>8} {r['peak_mem_gb']:>8.2f} {_est(r, 'est_tokens_per_s', ',.0f'):>10} "
                         f"{_est(r, 'est_peak_mem_gb', '.2f'):>7}  {r['status']}")
    overhead = result.get("overhead")
    if overhead is not None:
        model = next((o.split("=")[1] for o in overhead["overrides"] if o.startswith("model=")), "?")
        shown = f"{overhead['ratio']:.3f}" if "ratio" in overhead else overhead["status"]
        lines.append(f"overhead (engine / bare loop, model {model}, tracking=none): {shown}")
    if result.get("tests") is not None:
        lines.append(f"tests/gpu: {result['tests']['summary']}")
        lines.extend(f"  {line[:160]}" for line in result["tests"]["failed"])
    if plan.get("deferred"):
        lines.append(f"deferred to a second call: bash .ci/gpu-accept --parts {','.join(plan['deferred'])}")
    lines.append("targets (issue 15, one H100/H200):")
    lines.extend(f"  {t['target']:<46} {t['shown']:>9}  {t['verdict']}" for t in result["targets"])
    speedup = fp8_over_bf16(result)
    lines.append(f"fp8/bf16: {speedup:.2f}x" if speedup is not None
                 else "fp8/bf16: n/a (no finished bf16 and fp8_tensorwise rows)")
    return "\n".join(lines)
