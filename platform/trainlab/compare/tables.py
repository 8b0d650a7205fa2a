"""The summary as text: one column definition rendered to a rich table, Markdown, HTML and CSV."""

from __future__ import annotations

import csv
import html
from collections.abc import Callable
from dataclasses import asdict, fields
from pathlib import Path

from rich.table import Table
from rich.text import Text

from trainlab.compare import repro
from trainlab.compare.records import ConfigRow, Summary

NA = "-"  # where a configuration has no number (no finished trial, or nothing logged)


def fmt_tokens(n: float | None) -> str:
    """Token counts as 1.2M / 350k / 900, so columns stay narrow."""
    if n is None:
        return NA
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.3g}{unit}"
    return f"{n:.0f}"


def _pm(mean: float | None, std: float | None, spec: str, scale: float = 1.0, unit: str = "") -> str:
    if mean is None:
        return NA
    text = format(mean * scale, spec) + unit
    return text if std is None else f"{text} ± {format(std * scale, spec)}"


def _num(x: float | int | None, spec: str) -> str:
    return NA if x is None else format(x, spec)


def _pct(x: float | None) -> str:
    return NA if x is None else f"{100 * x:.3g}%"


def status_text(r: ConfigRow) -> str:
    parts = [f"{n} {what}" for n, what in ((r.n_finished, "finished"), (r.n_diverged, "diverged"),
                                            (r.n_pruned, "pruned"), (r.n_failed, "failed"),
                                            (r.n_running, "running")) if n]
    return ", ".join(parts) or "no trials"


def _target(r: ConfigRow) -> str:
    if not r.n_target_measured:
        return NA
    return f"{fmt_tokens(r.tokens_to_target_mean) if r.n_reached_target else 'never'} " \
           f"({r.n_reached_target}/{r.n_target_measured})"


COLUMNS: tuple[tuple[str, Callable[[ConfigRow], str]], ...] = (
    ("config", lambda r: r.label + (" (baseline)" if r.is_baseline else "")),
    ("trials", lambda r: str(r.n_trials)),
    ("status", status_text),
    ("tokens/s", lambda r: _pm(r.tokens_per_s_mean, r.tokens_per_s_std, ",.0f")),
    ("tok/s/device", lambda r: _num(r.tokens_per_s_per_device, ",.0f")),
    ("speedup", lambda r: _num(r.speedup, ".2f") + ("x" if r.speedup is not None else "")),
    ("MFU", lambda r: _pm(r.mfu_mean, r.mfu_std, ".1f", scale=100, unit="%")),
    ("peak GB", lambda r: _num(r.peak_mem_gb, ".2f")),
    ("hardware", lambda r: r.hardware or NA),
    ("final val loss", lambda r: _pm(r.final_val_loss_mean, r.final_val_loss_std, ".4f")),
    ("Δ val @ equal tokens", lambda r: _num(r.delta_val_loss, "+.4f")),
    ("verdict", lambda r: r.verdict or NA),
    ("to target", _target),
    ("skipped", lambda r: _num(r.skipped_steps, "d")),
    ("non-finite", lambda r: _num(r.nonfinite_steps, "d")),
    ("spikes", lambda r: _num(r.loss_spikes, "d")),
    ("diverged at", lambda r: ", ".join(map(str, r.diverged_steps)) or NA),
    ("pruned at", lambda r: ", ".join(map(str, r.pruned_steps)) or NA),
    ("max |g|", lambda r: _num(r.max_grad_norm, ".3g")),
    ("underflow", lambda r: _pct(r.max_underflow)),
    ("overflow", lambda r: _pct(r.max_overflow)),
)

DEFINITIONS = (
    "Numbers are over finished trials (mean ± sample std over seeds); stability columns over all trials.",
    "tokens/s, MFU: per trial the median over logged steps after the first; speedup = tokens/s / "
    "baseline's; tok/s/device = tokens/s / the trial's world size; MFU divides by the sum of each "
    "device's own peak, so a mix of GPU types counts each at its own; hardware: the device "
    "types the trials ran on (type:count).",
    "Δ val @ equal tokens: mean final val loss minus the baseline's mean val-loss-vs-tokens "
    "curve linearly interpolated at this configuration's mean final tokens seen (negative = better).",
    "to target: tokens seen at the first evaluation where val loss <= target, mean over the trials "
    "that reached it (reached/measured).",
    "diverged at: the steps where diverged trials stopped; pruned at: the steps where trials that "
    "hydra.launcher.prune stopped early ended (why: the trials' list); max |g|: largest finite grad norm.",
    "skipped / non-finite / spikes: final cumulative counters summed over trials.",
    "verdict: diverged if any trial diverged; pruned if every trial was pruned; degraded if Δ val exceeds "
    "the tolerance "
    "(default 1 % of the baseline's val loss); ok otherwise.",
    "underflow / overflow: largest sampled fraction of values a low-precision cast turned "
    "into zero / saturated, over every layer, tensor and trial (num/max/*).",
)


def cells(summary: Summary) -> list[list[str]]:
    return [[fn(r) for _, fn in COLUMNS] for r in summary.rows]


def headline(summary: Summary) -> list[str]:
    """The lines that say what the table was computed against."""
    target = "-" if summary.target_loss is None else f"{summary.target_loss:.4f}"
    return [f"baseline: {summary.baseline or '-'}",
            f"target loss: {target} ({summary.target_source})", *summary.notes]


STABILITY_FROM = "skipped"  # the terminal splits the table here: 15 columns do not fit a screen


def rich_tables(summary: Summary, *, title: str) -> list[Table]:
    """The summary as two terminal tables (results, then stability), each led by the config, and
    a reproducibility table when the sweep has runs that should match (compare.repro)."""
    split = [h for h, _ in COLUMNS].index(STABILITY_FROM)
    all_cells = cells(summary)
    out = []
    for part, cols in ((title, range(0, split)), (f"{title}: stability", range(split, len(COLUMNS)))):
        # 'trials' is left out: the status column already counts them, and width is scarce
        idx = [0, *[i for i in cols if i != 0 and COLUMNS[i][0] != "trials"]]
        table = Table(title=part)
        for i in idx:
            table.add_column(COLUMNS[i][0], overflow="fold")
        for r, row_cells in zip(summary.rows, all_cells):
            # no finished trial: red, there is nothing to compare; the baseline in bold
            style = "bold" if r.is_baseline else ("red" if not r.has_numbers else None)
            # Text, not markup: labels like 'layers=[2,4]' must print as they are
            table.add_row(*(Text(row_cells[i]) for i in idx), style=style)
        out.append(table)
    if summary.repro:
        out.append(repro.rich_table(summary.repro, title=title))
    return out


def markdown_table(summary: Summary) -> str:
    def line(items: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in items) + " |"

    out = [line([h for h, _ in COLUMNS]), line(["---"] * len(COLUMNS))]
    out += [line(c) for c in cells(summary)]
    return "\n".join(out)


def markdown_document(summary: Summary, *, title: str, context: list[str]) -> str:
    """summary.md: title, what it was computed against, the table and its definitions."""
    bullets = [f"- {x}" for x in [*context, *headline(summary)]]
    defs = [f"- {d}" for d in DEFINITIONS]
    repro_section = [repro.markdown(summary.repro)] if summary.repro else []
    return "\n".join([f"# {title}", "", f"**{summary.answer.line}**", "", *bullets, "", markdown_table(summary), "", *defs, "",
                      *repro_section])


def html_table(summary: Summary) -> str:
    """The summary as two tables (results, then stability, each led by the config, as in the
    terminal), each in a box that scrolls on its own: 21 columns side by side are wider than a
    1600 px window, and the page itself must not scroll sideways."""
    split = [h for h, _ in COLUMNS].index(STABILITY_FROM)
    all_cells = cells(summary)
    out = []
    for cls, idx in (("results", range(0, split)), ("stability", [0, *range(split, len(COLUMNS))])):
        head = "".join(f"<th>{html.escape(COLUMNS[i][0])}</th>" for i in idx)
        body = []
        for r, row_cells in zip(summary.rows, all_cells):
            row_cls = "baseline" if r.is_baseline else ("nonumbers" if not r.has_numbers else "")
            tds = "".join(f"<td>{html.escape(row_cells[i])}</td>" for i in idx)
            body.append(f'<tr class="{row_cls}">{tds}</tr>')
        out.append(f'<div class="scroll"><table class="{cls}">\n<thead><tr>{head}</tr></thead>\n<tbody>\n'
                   + "\n".join(body) + "\n</tbody>\n</table></div>")
    return "\n".join(out)


def write_csv(summary: Summary, path: Path) -> Path:
    """Raw numbers (unformatted, empty = none), one row per configuration, for further analysis."""
    keys = [f.name for f in fields(ConfigRow)] + ["target_loss"]
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=keys)
        writer.writeheader()
        for r in summary.rows:
            row = asdict(r)
            row["diverged_steps"] = " ".join(map(str, r.diverged_steps))
            row["pruned_steps"] = " ".join(map(str, r.pruned_steps))
            row["target_loss"] = summary.target_loss
            writer.writerow({k: "" if v is None else v for k, v in row.items()})
    return path
