"""What `trainlab estimate` prints: a table per trial and, for a sweep, the trials ranked.

Per trial: memory per rank by kind, the rank's device and the headroom left on it, the rank's
step time by kind; under it the step (the slowest rank's), tokens/s, MFU and the bound. Ranks
alike (same device, same bytes and seconds) share one row ('0-7'), so an 8-GPU node is a line.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.table import Table
from rich.text import Text

from trainlab.estimate.result import Estimate, RankEstimate
from trainlab.vocab.nodes import ClusterSpec

MEMORY_KINDS = (("params", "params"), ("grads", "grads"), ("optim", "optim_state"), ("fp8", "fp8_state"),
                ("activations", "activations"), ("buffers", "buffers"), ("runtime", "runtime"))
"""(column, RankMemory field) in the order a rank's memory is shown."""


def size(num_bytes: float) -> str:
    """Bytes for a person, in the unit that keeps 3 figures (GB as sys/peak_mem_gb: 1e9 bytes)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(num_bytes) >= scale:
            return f"{num_bytes / scale:.3g} {unit}"
    return f"{num_bytes:.0f} B"


def seconds(s: float) -> str:
    if s == 0:
        return "0"
    return f"{s * 1e6:.3g} µs" if s < 1e-3 else f"{s * 1e3:.3g} ms" if s < 1 else f"{s:.3g} s"


def mfu_text(est: Estimate) -> str:
    return "-" if est.mfu is None else f"{est.mfu:.1%}"


def _rank_key(r: RankEstimate) -> tuple:
    return (r.device.name, r.device.memory_gb, r.device.node, r.memory, r.time)


def rank_groups(est: Estimate) -> list[tuple[str, RankEstimate]]:
    """Consecutive ranks alike as one ('0-7', the first of them)."""
    groups: list[list[RankEstimate]] = []
    for r in est.ranks:
        if groups and _rank_key(groups[-1][-1]) == _rank_key(r):
            groups[-1].append(r)
        else:
            groups.append([r])
    return [(str(g[0].rank) if len(g) == 1 else f"{g[0].rank}-{g[-1].rank}", g[0]) for g in groups]


TIME_KINDS = (("compute", "compute_s"), ("comm", "comm_s"), ("bubble", "bubble_s"), ("overhead", "overhead_s"),
              ("wait", "wait_s"))
"""(column, RankTime field) of a rank's step."""


def rank_table(est: Estimate, *, title: str = "") -> Table:
    """A row per group of ranks alike; kinds no rank has (fp8 state in bf16, a bubble without a
    pipeline) are left out, so the table keeps to a terminal's width."""
    groups = rank_groups(est)
    memory = [(name, f) for name, f in MEMORY_KINDS if any(getattr(r.memory, f) for _, r in groups)]
    time = [(name, f) for name, f in TIME_KINDS if any(getattr(r.time, f) for _, r in groups)]
    nodes = len({r.device.node for r in est.ranks}) > 1
    table = Table(title=title or None, title_justify="left")
    for name in ("ranks", "device", *(n for n, _ in memory), "total", "capacity", "headroom", *(n for n, _ in time),
                 "step"):
        table.add_column(name, justify="left" if name in ("ranks", "device") else "right", no_wrap=True)
    for label, r in groups:
        m, t = r.memory, r.time
        headroom = Text(size(r.headroom_gb * 1e9), style="green" if r.headroom_gb >= 0 else "bold red")
        table.add_row(label, r.device.name + (f" n{r.device.node}" if nodes else ""),
                      *(size(getattr(m, f)) for _, f in memory), size(m.total), size(r.device.memory_gb * 1e9),
                      headroom, *(seconds(getattr(t, f)) for _, f in time), seconds(t.step_s))
    return table


def summary_line(est: Estimate) -> Text:
    """The step in one line: fits, step time, tokens/s, MFU, bound, where the efficiencies came from."""
    fits = Text("fits", style="green") if est.fits else Text(
        f"does NOT fit: rank {est.tightest.rank} short by {-est.tightest.headroom_gb:.2f} GB on its "
        f"{est.tightest.device.name}", style="bold red")
    return Text.assemble(fits, f"  step {seconds(est.step_time_s)}  tokens/s {est.tokens_per_s:,.0f}  "
                               f"MFU {mfu_text(est)}  bound: {est.bound}  peak {size(est.peak_mem_gb * 1e9)}  "
                               f"calibration: {est.calibration}")


@dataclass(frozen=True)
class TrialEstimate:
    """One trial of `trainlab estimate`: its label (the swept overrides), cluster and estimate,
    or the reason it has none."""

    label: str
    cluster: ClusterSpec | None
    estimate: Estimate | None
    note: str = ""
    error: str = ""


def trial_renderables(t: TrialEstimate) -> list:
    """The rank table, the summary line and the notes of one trial, ready for console.print."""
    where = f"{t.cluster.describe()} ({t.cluster.source})" if t.cluster else "-"
    if t.estimate is None:
        return [Text.assemble((f"{t.label} on {where}: ", "bold"), (f"no estimate: {t.error}", "red"))]
    out: list = [rank_table(t.estimate, title=f"{t.label} on {where}"), summary_line(t.estimate)]
    out += [Text(f"  note: {n}", style="dim") for n in (t.note, *t.estimate.notes) if n]
    return out


def ranking_table(trials: list[TrialEstimate]) -> Table:
    """A sweep's trials, those that fit first, then fastest first (tokens/s)."""
    def order(t: TrialEstimate) -> tuple:
        e = t.estimate
        return (e is None, e is not None and not e.fits, -(e.tokens_per_s if e else 0.0))

    table = Table(title="ranked: fits first, then tokens/s", title_justify="left")
    for name in ("#", "trial", "fits", "peak", "headroom", "step", "tokens/s", "MFU", "bound"):
        table.add_column(name, justify="left" if name in ("trial", "bound") else "right")
    for i, t in enumerate(sorted(trials, key=order), 1):
        e = t.estimate
        if e is None:
            table.add_row(str(i), t.label, Text("error", style="red"), *["-"] * 6)
            continue
        table.add_row(str(i), t.label, Text("yes", style="green") if e.fits else Text("no", style="bold red"),
                      size(e.peak_mem_gb * 1e9), size(e.tightest.headroom_gb * 1e9), seconds(e.step_time_s),
                      f"{e.tokens_per_s:,.0f}", mfu_text(e), e.bound)
    return table
