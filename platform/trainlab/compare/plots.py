"""The comparison plots as PNG files (matplotlib, Agg canvas; no pyplot, so no global state)."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from trainlab import names
from trainlab.compare import curves, pareto
from trainlab.compare.records import Summary, Trial

DPI = 110
VAL_LOSS_PNG = "val_loss_vs_tokens.png"
TRAIN_LOSS_PNG = "train_loss_vs_tokens.png"
THROUGHPUT_PNG = "throughput.png"
LOSS_SCALE_PNG = "loss_scale.png"
UNDERFLOW_PNG = "underflow.png"
PARETO_PNG = "pareto.png"
LABEL_ALL_UP_TO = 12  # pareto.png names every point up to this many configurations, else the front's


def _figure() -> tuple[Figure, object]:
    fig = Figure(figsize=(8, 4.8), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots()


def _colors(summary: Summary) -> dict[str, object]:
    """One color per configuration, the same in every plot."""
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return {r.label: cmap(i % 10) for i, r in enumerate(summary.rows)}


def _by_label(trials: Sequence[Trial]) -> dict[str, list[Trial]]:
    out: dict[str, list[Trial]] = {}
    for t in trials:
        out.setdefault(t.label, []).append(t)
    return out


def _no_data(ax, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} logged", ha="center", va="center", transform=ax.transAxes)


def _target_within(ax, target: float | None, values: list[float], *, across: bool = False,
                   pad_frac: float = 0.08) -> None:
    """Fit the loss axis (y, or x when `across`) to the plotted values (a target far off them
    would squash every curve into a band) and draw the target line where it falls on that
    axis, else name it in the legend."""
    if target is None or not values:
        return
    lo, hi = min(values), max(values)
    pad = pad_frac * (hi - lo) or 0.02 * abs(hi) or 0.01
    (ax.set_xlim if across else ax.set_ylim)(lo - pad, hi + pad)
    if lo - pad <= target <= hi + pad:
        (ax.axvline if across else ax.axhline)(target, color="grey", linestyle="--", linewidth=1,
                                               label=f"target {target:.3f}")
    else:
        where = ("right of" if target > hi else "left of") if across else ("above" if target > hi else "below")
        ax.plot([], [], color="grey", linestyle="--", linewidth=1, label=f"target {target:.3f} ({where} this range)")


def _final_points(summary: Summary, trials: Sequence[Trial], *, key: str, ylabel: str,
                  title: str, target: float | None) -> Figure:
    """Every trial logged one point (a short run evaluated once): a dot per trial on one row per
    configuration, the mean over finished seeds marked and written, rather than lone dots on a
    tokens axis."""
    fig, ax = _figure()
    colors, groups, xs = _colors(summary), _by_label(trials), []
    rows = [r for r in summary.rows if any(curves.finite_points(t.series(key)) for t in groups.get(r.label, []))]
    for i, r in enumerate(rows):
        done = []
        for t in groups.get(r.label, []):
            pts = curves.finite_points(t.series(key))
            if not pts:
                continue
            finished = t.status == names.STATUS_FINISHED
            ax.plot(pts[-1][1], i, linestyle="none", color=colors[r.label], alpha=0.8,
                    marker="o" if finished else "x", markersize=6 if finished else 8)
            xs.append(pts[-1][1])
            done += [pts[-1][1]] if finished else []
        if done:
            mean = sum(done) / len(done)
            ax.plot(mean, i, marker="|", markersize=22, markeredgewidth=2, color=colors[r.label])
            ax.annotate(f"{mean:.4f} (n={len(done)})", (mean, i), xytext=(0, 12), textcoords="offset points",
                        ha="center", fontsize="small")
    # labels of several swept keys are long: one key per line keeps the plot its width
    ax.set_yticks(range(len(rows)), [textwrap.fill(r.label, 28) for r in rows], fontsize="small")
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.invert_yaxis()  # the table's order, top to bottom
    for marker, size, what in (("o", 6, "a finished trial"), ("x", 8, "diverged / pruned"), ("|", 14, "mean")):
        ax.plot([], [], linestyle="none", marker=marker, markersize=size, color="grey", label=what)
    _target_within(ax, target, xs, across=True, pad_frac=0.15)
    ax.legend(fontsize="small")
    ax.set(xlabel=f"{ylabel} at each trial's only evaluation", title=title)
    ax.grid(alpha=0.3, axis="x")
    return fig


def loss_vs_tokens(summary: Summary, trials: Sequence[Trial], *, metric: str, ylabel: str,
                   title: str, path: Path, target: float | None = None) -> Path:
    """loss_vs_tokens_figure as a PNG at path."""
    loss_vs_tokens_figure(summary, trials, metric=metric, ylabel=ylabel, title=title,
                          target=target).savefig(path)
    return path


def loss_vs_tokens_figure(summary: Summary, trials: Sequence[Trial], *, metric: str, ylabel: str,
                          title: str, target: float | None = None) -> Figure:
    """Mean over finished seeds with a min–max band; diverged and pruned trials as thin dotted lines.
    When no trial logged more than one point, one row of points per configuration instead."""
    key = names.by_tokens(metric)
    lengths = [len(curves.finite_points(t.series(key))) for t in trials]
    if lengths and max(lengths) == 1:
        return _final_points(summary, trials, key=key, ylabel=ylabel, title=title, target=target)
    fig, ax = _figure()
    colors, groups, drawn, ys = _colors(summary), _by_label(trials), False, []
    for r in summary.rows:
        ts = groups.get(r.label, [])
        done = [t.series(key) for t in ts if t.status == names.STATUS_FINISHED and t.series(key)]
        x, mean, lo, hi = curves.seed_band(done)
        if x.size:
            n = len(done)
            ax.plot(x, mean, color=colors[r.label], marker="." if x.size < 30 else None,
                    label=f"{r.label} (n={n})")
            if n > 1:
                ax.fill_between(x, lo, hi, color=colors[r.label], alpha=0.2, linewidth=0)
            drawn = True
            ys += [*lo.tolist(), *hi.tolist()]
        for t in ts:
            pts = curves.finite_points(t.series(key))
            if t.status in (names.STATUS_DIVERGED, names.STATUS_PRUNED) and pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], color=colors[r.label], marker="x",
                        markevery=[len(pts) - 1], linestyle=":", linewidth=1,
                        label=f"{r.label} seed {t.seed or '?'} ({t.status})")
                drawn = True
                ys += [p[1] for p in pts]
    if not drawn:
        _no_data(ax, ylabel)
    else:
        _target_within(ax, target, ys)
        ax.legend(fontsize="small")
    ax.set(xlabel="tokens seen", ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    return fig


def throughput(summary: Summary, *, title: str, path: Path) -> Path:
    """Mean tokens/s per configuration with sample-std error bars, speedup written on top."""
    fig, ax = _figure()
    colors = _colors(summary)
    rows = [r for r in summary.rows if r.tokens_per_s_mean is not None]
    if rows:
        xs = range(len(rows))
        bars = ax.bar(xs, [r.tokens_per_s_mean for r in rows], yerr=[r.tokens_per_s_std or 0 for r in rows],
                      capsize=4, color=[colors[r.label] for r in rows])
        ax.bar_label(bars, labels=[f"{r.speedup:.2f}x" if r.speedup is not None else "" for r in rows],
                     padding=3)
        ax.set_xticks(list(xs), [r.label for r in rows], rotation=20, ha="right")
    else:
        _no_data(ax, "tokens/s")
    ax.set(ylabel="tokens/s (median per trial, mean ± std over seeds)", title=title)
    ax.grid(alpha=0.3, axis="y")
    fig.savefig(path)
    return path


def loss_scale(summary: Summary, trials: Sequence[Trial], *, title: str, path: Path) -> Path | None:
    """The fp16 loss scale over steps, one line per trial; None (no file) if no trial has one."""
    with_scale = [t for t in trials if curves.finite_points(t.series(names.LOSS_SCALE))]
    if not with_scale:
        path.unlink(missing_ok=True)  # a stale plot from an earlier compare would mislead
        return None
    fig, ax = _figure()
    colors = _colors(summary)
    seen: dict[str, int] = {}
    for t in with_scale:
        pts = curves.finite_points(t.series(names.LOSS_SCALE))
        # seeds of one configuration share a color; dashes tell them apart where they overlap
        k = seen[t.label] = seen.get(t.label, -1) + 1
        style = ("-", "--", "-.")[k % 3] if t.status == names.STATUS_FINISHED else ":"
        ax.step([p[0] for p in pts], [p[1] for p in pts], where="post", color=colors.get(t.label),
                linestyle=style, label=f"{t.label} seed {t.seed or '?'} ({t.status})")
    if all(v > 0 for t in with_scale for _, v in curves.finite_points(t.series(names.LOSS_SCALE))):
        ax.set_yscale("log", base=2)  # the scaler halves and doubles: powers of two line up
    ax.set(xlabel="optimizer step", ylabel="loss scale", title=title)
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    fig.savefig(path)
    return path


def underflow_figure(summary: Summary, trials: Sequence[Trial], *, title: str) -> Figure | None:
    """Worst-layer underflow fraction of each cast kind over steps, one line per trial; None
    when no trial cast anything to low precision."""
    kinds = [(k, names.cast_max_metric(k, names.CAST_UNDERFLOW)) for k in names.CAST_TENSORS]
    if not any(curves.finite_points(t.series(key)) for t in trials for _, key in kinds):
        return None
    fig = Figure(figsize=(12, 4.2), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(kinds), sharey=True)
    colors = _colors(summary)
    for ax, (kind, key) in zip(axes, kinds):
        seen: set[str] = set()
        for t in trials:
            pts = curves.finite_points(t.series(key))
            if not pts:
                continue
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color=colors.get(t.label),
                    linestyle="-" if t.status == names.STATUS_FINISHED else ":",
                    label=None if t.label in seen else t.label)
            seen.add(t.label)
        ax.set(xlabel="optimizer step", title=f"{kind}: worst layer")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of non-zero values cast to 0")
    axes[0].set_yscale("symlog", linthresh=1e-4)  # 0.01 % and 99 % both readable
    # a fraction is in [0, 1]: symlog's margins would otherwise show negative fractions below 0
    top = axes[0].get_ylim()[1]
    axes[0].set_ylim(0, min(top, 1.0) if top > 0 else 1e-4)
    handles, labels = axes[0].get_legend_handles_labels()
    for ax in axes[1:]:
        h, la = ax.get_legend_handles_labels()
        handles += [x for x, y in zip(h, la) if y not in labels]
        labels += [y for y in la if y not in labels]
    fig.legend(handles, labels, loc="outside right upper", fontsize="small")
    fig.suptitle(title)
    return fig


def underflow(summary: Summary, trials: Sequence[Trial], *, title: str, path: Path) -> Path | None:
    """underflow_figure as a PNG at path; None (no file) when there is nothing to plot."""
    fig = underflow_figure(summary, trials, title=title)
    if fig is None:
        path.unlink(missing_ok=True)  # a stale plot from an earlier compare would mislead
        return None
    fig.savefig(path)
    return path


def pareto_figure(summary: Summary, *, title: str) -> Figure | None:
    """Every configuration with both values as a point on the study's first two objectives (x the
    second, y the first), the front's points ringed, labelled and joined by the staircase that
    bounds what they dominate; None where the sweep has no front. With three objectives or more
    the front is over all of them, so its points are ringed but not joined (no staircase in 2-D)."""
    if not pareto.has_front(summary.objectives):
        return None
    y_obj, x_obj = summary.objectives[:2]
    fig, ax = _figure()
    colors = _colors(summary)
    pts = [(r, r.objective_values[1], r.objective_values[0]) for r in summary.rows
           if None not in r.objective_values[:2]]
    front = sorted((p for p in pts if p[0].pareto), key=lambda p: (p[1], p[2]))
    for r, x, y in pts:
        ax.plot(x, y, linestyle="none", marker="o", color=colors[r.label], markersize=9 if r.pareto else 6,
                markeredgecolor="black" if r.pareto else "none", markeredgewidth=1.5, alpha=1 if r.pareto else 0.6,
                zorder=3)
    if front and len(summary.objectives) == 2:
        # the corner between two neighbours is the one worse than both: "pre" goes up (down) at the
        # left point where higher x is better, "post" at the right one where lower is
        ax.step([p[1] for p in front], [p[2] for p in front], where="pre" if x_obj.better > 0 else "post",
                color="black", linewidth=1.2, zorder=2)
    # a few configurations: every point named; many (a long search): the front's only, still readable
    for r, x, y in front if len(pts) > LABEL_ALL_UP_TO else pts:
        ax.annotate(textwrap.fill(r.label, 28), (x, y), xytext=(6, 6), textcoords="offset points",
                    fontsize="small", color="black" if r.pareto else "dimgrey")
    ax.margins(0.12)  # room for the labels of the outermost points
    if not pts:
        _no_data(ax, "objective value")
    else:
        for what, edge, size in (("on the Pareto front", "black", 9), ("dominated", "none", 6)):
            ax.plot([], [], linestyle="none", marker="o", color="grey", markeredgecolor=edge,
                    markeredgewidth=1.5, markersize=size, label=what)
        ax.legend(fontsize="small")
    over = "" if len(summary.objectives) == 2 else (
        f"\n(front over {', '.join(o.name for o in summary.objectives)}; the first two plotted)")
    ax.set(xlabel=f"{x_obj.name} ({pareto.better_words(x_obj)})",
           ylabel=f"{y_obj.name} ({pareto.better_words(y_obj)})", title=title + over)
    ax.grid(alpha=0.3)
    return fig


def pareto_plot(summary: Summary, *, title: str, path: Path) -> Path | None:
    """pareto_figure as a PNG at path; None (no file) where the sweep has no front."""
    fig = pareto_figure(summary, title=title)
    if fig is None:
        path.unlink(missing_ok=True)  # a stale plot from an earlier compare would mislead
        return None
    fig.savefig(path)
    return path


def write_all(summary: Summary, trials: Sequence[Trial], *, sweep: str, out_dir: Path) -> list[Path]:
    """Every plot into out_dir; pareto.png (first) only in a study of several objectives,
    loss_scale.png only when some configuration has a loss scale, underflow.png only when some
    trial cast to low precision."""
    target = summary.target_loss if summary.target_loss is not None and math.isfinite(
        summary.target_loss) else None
    front = pareto_plot(summary, title=f"{sweep}: Pareto front (mean over seeds)", path=out_dir / PARETO_PNG)
    paths = [
        loss_vs_tokens(summary, trials, metric=names.VAL_LOSS, ylabel="validation loss",
                       title=f"{sweep}: validation loss", path=out_dir / VAL_LOSS_PNG, target=target),
        loss_vs_tokens(summary, trials, metric=names.LOSS, ylabel="training loss",
                       title=f"{sweep}: training loss", path=out_dir / TRAIN_LOSS_PNG),
        throughput(summary, title=f"{sweep}: throughput", path=out_dir / THROUGHPUT_PNG),
    ]
    scale = loss_scale(summary, trials, title=f"{sweep}: loss scale", path=out_dir / LOSS_SCALE_PNG)
    under = underflow(summary, trials, title=f"{sweep}: underflow of low-precision casts",
                      path=out_dir / UNDERFLOW_PNG)
    return [p for p in (front,) if p] + paths + [p for p in (scale, under) if p]
