"""report.html: one self-contained page (inline CSS, PNGs as base64) that opens anywhere."""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from pathlib import Path

from trainlab.compare import repro, tables
from trainlab.compare.records import Summary, Trial

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
.answer { font-size: 1.25em; font-weight: 600; margin: 0 0 1em; padding: 0.6em 1em;
          border-left: 6px solid #2a7d4f; background: #eef7f1; }
.answer.none { border-left-color: #b35c00; background: #fdf3e6; }
.pareto { font-weight: 600; margin: -0.5em 0 1em; padding: 0.4em 1em; border-left: 6px solid #3b6ea5;
          background: #eef3fa; }
.scroll { max-width: 100%; overflow-x: auto; }  /* a wide table scrolls in its box, not the page */
table { border-collapse: collapse; font-size: 0.9em; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: right; white-space: nowrap; }
th { white-space: normal; vertical-align: bottom; }  /* long headers wrap: numbers set the width */
th:first-child, td:first-child { text-align: left; }
td:first-child { white-space: normal; min-width: 12em; }  /* long labels wrap at their spaces */
.trials td:last-child { white-space: normal; text-align: left; min-width: 20em; }
thead th { background: #f2f2f2; }
tr.baseline td { font-weight: bold; }
tr.nonumbers td { color: #b00; }
img { max-width: 100%; display: block; margin: 1em 0; }
.meta, .defs { color: #555; font-size: 0.9em; }
"""


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'


def _trials_table(trials: Sequence[Trial]) -> str:
    """Per-trial status with the error of failed ones and the reason of pruned ones, so an early
    end is explained on the page."""
    rows = []
    for t in trials:
        err = t.error.strip().splitlines()[-1][:300] if t.error.strip() else t.pruned_reason
        stopped = t.diverged_step if t.diverged_step is not None else t.pruned_step
        step = "" if stopped is None else str(stopped)
        cells = (t.label, t.seed, t.status, step, t.run_id, err)
        rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in ("config", "seed", "status", "stopped at step", "run id",
                                             "error / why pruned"))
    return (f'<div class="scroll trials"><table><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}'
            f"</tbody></table></div>")


def write_report(summary: Summary, trials: Sequence[Trial], *, title: str, context: list[str],
                 images: Sequence[Path], path: Path, estimates_html: str = "") -> Path:
    """The answer (compare.answer) first and, in a study of several objectives, its Pareto front;
    then the title, what the table was computed against, the summary table, estimate vs measured
    (compare.estimates, where trials were estimated), the plots, the trials."""
    result = summary.answer
    front = f'<p class="pareto" id="pareto">{html.escape(result.pareto_line)}</p>\n' if result.pareto_line else ""
    meta = "".join(f"<li>{html.escape(x)}</li>" for x in [*context, *tables.headline(summary)])
    defs = "".join(f"<li>{html.escape(d)}</li>" for d in tables.definitions(summary))
    imgs = "\n".join(_img(p) for p in images)
    page = f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{html.escape(title)}</title>
<style>{_CSS}</style>
</head>
<body>
<p class="answer{'' if result.best else ' none'}" id="answer">{html.escape(result.line)}</p>
{front}<h1>{html.escape(title)}</h1>
<ul class="meta">{meta}</ul>
<h2>Summary</h2>
{tables.html_table(summary)}
<ul class="defs">{defs}</ul>
<div class="scroll">{repro.html_section(summary.repro) if summary.repro else ""}</div>
{estimates_html}
<h2>Plots</h2>
{imgs}
<h2>Trials</h2>
{_trials_table(trials)}
</body>
</html>
"""
    path.write_text(page, encoding="utf-8")
    return path
