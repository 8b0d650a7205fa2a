"""What a person sees: a live progress line (step, loss, tokens/s, ETA) and the final summary.

On a terminal the line is a rich progress bar; in a log (CI, `ray job logs`) it becomes a
plain line every tenth of the run, so logs stay readable.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from trainlab.events import WARNING, ProgressEvent, StepDone, TrialResult, TrialStarted

# in a log (not a terminal) rich would wrap tables at 80 columns; logs can be wide. A line is
# never broken (soft_wrap): a path or a URI in it stays whole for grep and a copy, at any width.
console = Console(stderr=False, highlight=False, soft_wrap=True,
                  width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160)


def warn(text: str) -> None:
    """One `warning:` line; `text` is shown as it is (a setting such as keep_hp=[output,unaligned]
    is not rich markup, whose square brackets would swallow it)."""
    console.print(f"[yellow]warning:[/] {escape(text)}", soft_wrap=True)


def print0(*args, **kwargs) -> None:
    """Print from rank 0 only (safe to call before a process group exists)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_rank() == 0:
        console.print(*args, **kwargs)


def fmt(x: float | None, spec: str = ".3f") -> str:
    """A number for a person: '-' when there is none (None or NaN)."""
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def status_text(status: str, result: TrialResult | None, *, pruned_reason: str = "") -> str:
    """'diverged at step 7 (first non-finite: activation:layers.0.feed_forward)', 'pruned at
    step 40 (val loss ... above the best trial's ...)', else status; with the rollbacks it took:
    'finished after 1 rollback (step 6 -> 4 (lr x0.5))'."""
    text = status
    if result is None:
        return text
    if status == "diverged" and result.diverged_step is not None:
        text = f"{status} at step {result.diverged_step} (first non-finite: {result.first_nonfinite or 'loss'})"
    if status == "pruned":
        text = f"{status} at step {result.steps}" + (f" ({pruned_reason})" if pruned_reason else "")
    if result.rollbacks:
        n = result.rollbacks
        text += f" after {n} rollback{'s' * (n > 1)} ({result.extra.get('rollbacks', '')})"
    return text


class ProgressLine:
    """Consumes the engine's progress events (trainlab.events)."""

    def __init__(self, *, description: str = "train"):
        self.description = description
        self.live = console.is_terminal
        self._progress: Progress | None = None
        self._task = None
        self._max_steps = 0
        self._every = 1
        self._t0 = time.perf_counter()
        self.val_loss: float | None = None

    def __call__(self, event: ProgressEvent) -> None:
        if isinstance(event, TrialStarted):
            self._start(event)
        elif isinstance(event, StepDone):
            self._step(event)
        elif event.kind == WARNING:
            warn(event.message)
        else:  # resumed, resized, rollback (the trial goes on from a checkpoint), exported
            console.print(f"[cyan]{escape(event.message)}[/]")

    def _start(self, event: TrialStarted) -> None:
        if self._progress is not None:  # a restart: one bar, continued
            self._progress.stop()
            self._progress = None
        self._max_steps = event.max_steps
        self._every = max(1, self._max_steps // 10)
        self._t0 = time.perf_counter()
        console.print(f"[bold]{self.description}[/] on {event.world_size} x "
                      f"{event.device}; unigram entropy {fmt(event.unigram_entropy)} nats"
                      + (f", true entropy {fmt(event.true_entropy)}" if event.true_entropy else ""))
        if self.live:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(),
                TextColumn("step {task.completed:.0f}/{task.total:.0f}"),
                TextColumn("{task.fields[stats]}"), TimeElapsedColumn(), TextColumn("ETA"),
                TimeRemainingColumn(), console=console, transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task(self.description, total=self._max_steps, stats="",
                                                 completed=event.step)

    def _step(self, event: StepDone) -> None:
        if event.val_loss is not None:
            self.val_loss = event.val_loss
        stats = (f"loss {fmt(event.loss)}  val {fmt(self.val_loss)}  "
                 f"{fmt(event.tokens_per_s, ',.0f')} tok/s")
        step = event.step
        if self._progress is not None:
            self._progress.update(self._task, completed=step, stats=stats)
        elif step % self._every == 0 or step == self._max_steps:
            elapsed = time.perf_counter() - self._t0
            eta = elapsed / step * (self._max_steps - step)
            console.print(f"step {step}/{self._max_steps}  {stats}  ETA {eta:.0f}s")
            sys.stdout.flush()

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def summary_table(title: str, rows: dict[str, str]) -> Table:
    """Key | value rows; a value too wide for the console folds onto more lines, whole (a path
    or a store URI cut to '...' could not be copied)."""
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column()
    table.add_column(overflow="fold")
    for k, v in rows.items():
        table.add_row(k, v)
    return table


class SweepProgress:
    """Progress of concurrent trials: a bar per running trial on a terminal; in a log, one
    status line every `every_s` seconds naming each running trial's step."""

    def __init__(self, *, total: int, every_s: float = 30.0):
        self.total, self.every_s = total, every_s
        self.done = 0
        self._steps: dict[str, tuple[int, int]] = {}
        self._lock = threading.Lock()
        self._last_print = time.perf_counter()
        self._progress: Progress | None = None
        self._tasks: dict[str, int] = {}
        if console.is_terminal:
            self._progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                      TextColumn("{task.completed:.0f}/{task.total:.0f}"),
                                      TimeElapsedColumn(), console=console, transient=True)
            self._progress.start()

    def step(self, name: str, step: int, max_steps: int) -> None:
        with self._lock:
            self._steps[name] = (step, max_steps)
            if self._progress is not None:
                if name not in self._tasks:
                    self._tasks[name] = self._progress.add_task(name, total=max_steps)
                self._progress.update(self._tasks[name], completed=step)
            elif time.perf_counter() - self._last_print >= self.every_s:
                self._last_print = time.perf_counter()
                running = ", ".join(f"{n} {s}/{m}" for n, (s, m) in sorted(self._steps.items()))
                console.print(f"{self.done}/{self.total} trials done; running: {running}")

    def note(self, name: str, message: str) -> None:
        """A line about one running trial (it resumed from a checkpoint, ...)."""
        with self._lock:
            console.print(f"{name}: {message}")

    def finished(self, name: str, line: str) -> None:
        with self._lock:
            self.done += 1
            self._steps.pop(name, None)
            if self._progress is not None and name in self._tasks:
                self._progress.remove_task(self._tasks.pop(name))
            console.print(line)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


class CountLine:
    """`what i/total` on stderr while a driver works through many items (a sweep's jobs being
    composed and planned): rewritten in place on a terminal, in a log a line every tenth and at
    the end, so a long preparation is never silent."""

    def __init__(self, what: str, total: int, *, stream=None):
        self.what, self.total, self.done = what, total, 0
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self._every = max(1, math.ceil(total / 10))

    def tick(self) -> None:
        self.done += 1
        if self.tty:
            end = "\n" if self.done >= self.total else ""
            print(f"\r{self.what} {self.done}/{self.total}", end=end, file=self.stream, flush=True)
        elif self.done % self._every == 0 or self.done >= self.total:
            print(f"{self.what} {self.done}/{self.total}", file=self.stream, flush=True)
