"""The summary as text: one column definition rendered to a rich table, Markdown, HTML and CSV.

A study of several objectives adds one column per objective and `pareto` after the status
(columns), and a line naming its front after the answer; a sweep of one shows neither."""

from __future__ import annotations

import csv
import html
from collections.abc import Callable
from dataclasses import asdict, fields
from pathlib import Path

from rich.table import Table
from rich.text import Text

from trainlab.compare import pareto, repro
from trainlab.compare.records import ConfigRow, Summary
from trainlab.vocab.objectives import Objective

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


PARETO_DEFINITION = (
    "objective/<name> ↓ / ↑: what the configuration's trials returned to the sweeper (lower / higher is "
    "better), mean over its finished and pruned trials with a finite value; pareto: yes when no other "
    "configuration is at least as good on every objective and better on one, - where a value is missing.")

Column = tuple[str, Callable[[ConfigRow], str]]


def _objective_value(x: float | None) -> str:
    # objectives range from a loss (3.4127) to a throughput (183,412 tokens/s): five digits of either
    return NA if x is None else f"{x:,.0f}" if abs(x) >= 1000 else f"{x:#.5g}"


def _objective_column(i: int, o: Objective) -> Column:
    return f"{o.metric} {pareto.arrow(o)}", lambda r: _objective_value(r.objective_values[i])


def _pareto_cell(r: ConfigRow) -> str:
    if None in r.objective_values:
        return NA
    return "yes" if r.pareto else "no"


def columns(summary: Summary) -> tuple[Column, ...]:
    """COLUMNS; in a study of several objectives, with one column per objective and `pareto`
    after the status, where a reader of a trade-off looks first."""
    if not pareto.has_front(summary.objectives):
        return COLUMNS
    at = [h for h, _ in COLUMNS].index("status") + 1
    study = (*(_objective_column(i, o) for i, o in enumerate(summary.objectives)), ("pareto", _pareto_cell))
    return (*COLUMNS[:at], *study, *COLUMNS[at:])


def definitions(summary: Summary) -> tuple[str, ...]:
    """DEFINITIONS, and the objective and pareto columns' where the table has them."""
    return (*DEFINITIONS, PARETO_DEFINITION) if pareto.has_front(summary.objectives) else DEFINITIONS


def cells(summary: Summary) -> list[list[str]]:
    return [[fn(r) for _, fn in columns(summary)] for r in summary.rows]


def answer_lines(summary: Summary) -> list[str]:
    """The answer's line, and in a study of several objectives the line naming its front."""
    return [summary.answer.line, *filter(None, [summary.answer.pareto_line])]


def headline(summary: Summary) -> list[str]:
    """The lines that say what the table was computed against."""
    target = "-" if summary.target_loss is None else f"{summary.target_loss:.4f}"
    return [f"baseline: {summary.baseline or '-'}",
            f"target loss: {target} ({summary.target_source})", *summary.notes]


STABILITY_FROM = "skipped"  # the terminal splits the table here: 15 columns do not fit a screen


def rich_tables(summary: Summary, *, title: str) -> list[Table]:
    """The summary as two terminal tables (results, then stability), each led by the config, and
    a reproducibility table when the sweep has runs that should match (compare.repro)."""
    cols_all = columns(summary)
    split = [h for h, _ in cols_all].index(STABILITY_FROM)
    all_cells = cells(summary)
    out = []
    for part, cols in ((title, range(0, split)), (f"{title}: stability", range(split, len(cols_all)))):
        # 'trials' is left out: the status column already counts them, and width is scarce
        idx = [0, *[i for i in cols if i != 0 and cols_all[i][0] != "trials"]]
        table = Table(title=part)
        for i in idx:
            table.add_column(cols_all[i][0], overflow="fold")
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

    cols = columns(summary)
    out = [line([h for h, _ in cols]), line(["---"] * len(cols))]
    out += [line(c) for c in cells(summary)]
    return "\n".join(out)


def markdown_document(summary: Summary, *, title: str, context: list[str]) -> str:
    """summary.md: title, the answer (and the Pareto front), what it was computed against, the
    table and its definitions."""
    bullets = [f"- {x}" for x in [*context, *headline(summary)]]
    defs = [f"- {d}" for d in definitions(summary)]
    repro_section = [repro.markdown(summary.repro)] if summary.repro else []
    answer = [f"**{x}**\n" for x in answer_lines(summary)]  # a paragraph each
    return "\n".join([f"# {title}", "", *answer, *bullets, "", markdown_table(summary), "", *defs, "",
                      *repro_section])


def html_table(summary: Summary) -> str:
    """The summary as two tables (results, then stability, each led by the config, as in the
    terminal), each in a box that scrolls on its own: 21 columns side by side are wider than a
    1600 px window, and the page itself must not scroll sideways."""
    cols = columns(summary)
    split = [h for h, _ in cols].index(STABILITY_FROM)
    all_cells = cells(summary)
    out = []
    for cls, idx in (("results", range(0, split)), ("stability", [0, *range(split, len(cols))])):
        head = "".join(f"<th>{html.escape(cols[i][0])}</th>" for i in idx)
        body = []
        for r, row_cells in zip(summary.rows, all_cells):
            row_cls = "baseline" if r.is_baseline else ("nonumbers" if not r.has_numbers else "")
            tds = "".join(f"<td>{html.escape(row_cells[i])}</td>" for i in idx)
            body.append(f'<tr class="{row_cls}">{tds}</tr>')
        out.append(f'<div class="scroll"><table class="{cls}">\n<thead><tr>{head}</tr></thead>\n<tbody>\n'
                   + "\n".join(body) + "\n</tbody>\n</table></div>")
    return "\n".join(out)


_STUDY_FIELDS = ("objective_values", "pareto")  # ConfigRow's, written as columns of their own (write_csv)


def write_csv(summary: Summary, path: Path) -> Path:
    """Raw numbers (unformatted, empty = none), one row per configuration, for further analysis. A
    study of several objectives adds a column per objective (named as its metric,
    `objective/<name>`) and `pareto` (true / false, as the trial runs' tag); a sweep of one, neither."""
    study = pareto.has_front(summary.objectives)
    keys = [f.name for f in fields(ConfigRow) if f.name not in _STUDY_FIELDS]
    keys += [*(o.metric for o in summary.objectives), "pareto"] if study else []
    keys += ["target_loss"]
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=keys)
        writer.writeheader()
        for r in summary.rows:
            row = {k: v for k, v in asdict(r).items() if k not in _STUDY_FIELDS}
            row["diverged_steps"] = " ".join(map(str, r.diverged_steps))
            row["pruned_steps"] = " ".join(map(str, r.pruned_steps))
            if study:
                row |= {o.metric: v for o, v in zip(summary.objectives, r.objective_values)}
                row["pareto"] = "true" if r.pareto else "false"
            row["target_loss"] = summary.target_loss
            writer.writerow({k: "" if v is None else v for k, v in row.items()})
    return path
