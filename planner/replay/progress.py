"""A progress bar for long replay runs, driven by the simulated clock.

The simulator opens one bar per policy run and reports its clock::

    with replay_progress("lvf", total_simulated_s=last_arrival_s,
                         requests=len(trace), quiet=args.quiet) as bar:
        while ...:
            ...
            bar.update(now_s, finished=done)   # absolute simulated time
            # or bar.advance(iteration_s)      # a step of simulated time

Calls are cheap (a float add and a clock read, ~0.1 µs; the bar is redrawn
at most every `refresh_s` of wall time), so once per iteration is fine.

The bar appears only on a terminal, not with `quiet`, and only once the run
has taken `delay_s` of wall time, so short runs print nothing. Its fraction
done is the simulated clock over `total_simulated_s`, or, when the run
reports finished requests, the smaller of that and finished / `requests`:
a run still draining its queues after the last arrival is not yet done.
Without either total the bar has no end and shows only the counts.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Column
from rich.text import Text


class ProgressHandle:
    """What a run reports to; this base class ignores everything (the
    disabled bar)."""

    enabled = False

    def advance(self, simulated_s: float) -> None:
        """Simulated time moved on by `simulated_s` seconds."""

    def update(self, now_s: float, *, finished: int | None = None) -> None:
        """The simulated clock reads `now_s`; `finished` requests are done."""

    def set_finished(self, finished: int) -> None:
        """`finished` requests are done (the clock unchanged)."""

    def fraction(self) -> float:
        """The fraction of the run done, as the bar shows it (0 when off)."""
        return 0.0


class _PercentColumn(ProgressColumn):
    def render(self, task: Task) -> Text:
        if task.total is None:
            return Text("")
        return Text(f"{task.percentage:>3.0f}%", style="progress.percentage")


class _CountsColumn(ProgressColumn):
    """'123/600 sim s  45/1,000 req' (totals where known)."""

    def render(self, task: Task) -> Text:
        f = task.fields
        total_s = f["total_s"]
        now_s: float = f["now_s"]
        text = f"{now_s:,.0f}"
        if total_s is not None and now_s <= total_s:
            text += f"/{total_s:,.0f}"
        text += " sim s"
        if f["finished"] is not None:
            requests = f["requests"]
            text += f"  {f['finished']:,}" + (f"/{requests:,}" if requests is not None else "")
            text += " req"
        return Text(text, style="progress.download")


class _SpeedColumn(ProgressColumn):
    """Simulated seconds per wall-clock second."""

    def render(self, task: Task) -> Text:
        elapsed = task.elapsed
        now_s: float = task.fields["now_s"]
        if not elapsed or now_s <= 0:
            return Text("")
        speed = now_s / elapsed
        shown = f"{speed:,.0f}" if speed >= 100 else f"{speed:.1f}"
        return Text(f"{shown}x real time", style="progress.data.speed")


class _RichHandle(ProgressHandle):
    enabled = True

    def __init__(
        self,
        progress: Progress,
        *,
        description: str,
        total_s: float | None,
        requests: int | None,
        delay_s: float,
        refresh_s: float,
    ) -> None:
        self._progress = progress
        self._total_s = total_s if total_s is not None and total_s > 0 else None
        self._requests = requests if requests is not None and requests > 0 else None
        bounded = self._total_s is not None or self._requests is not None
        self._task: TaskID = progress.add_task(
            description,
            total=1.0 if bounded else None,
            now_s=0.0,
            total_s=self._total_s,
            finished=None,
            requests=self._requests,
        )
        self._now = 0.0
        self._finished: int | None = None
        self._refresh_s = refresh_s
        self._next = time.monotonic() + delay_s
        self._shown = False

    def advance(self, simulated_s: float) -> None:
        self._now += simulated_s
        if time.monotonic() >= self._next:
            self._push()

    def update(self, now_s: float, *, finished: int | None = None) -> None:
        self._now = now_s
        if finished is not None:
            self._finished = finished
        if time.monotonic() >= self._next:
            self._push()

    def set_finished(self, finished: int) -> None:
        self._finished = finished
        if time.monotonic() >= self._next:
            self._push()

    def fraction(self) -> float:
        parts: list[float] = []
        if self._total_s is not None:
            parts.append(self._now / self._total_s)
        if self._requests is not None and self._finished is not None:
            parts.append(self._finished / self._requests)
        return max(0.0, min([1.0, *parts])) if parts else 0.0

    def _push(self) -> None:
        self._progress.update(
            self._task, completed=self.fraction(), now_s=self._now, finished=self._finished
        )
        if not self._shown:
            self._progress.start()
            self._shown = True
        self._progress.refresh()
        self._next = time.monotonic() + self._refresh_s

    def close(self) -> None:
        if self._shown:
            self._push()
            self._progress.stop()


def _no_wrap() -> Column:
    return Column(no_wrap=True)


def progress_enabled(console: Console, *, quiet: bool) -> bool:
    """A bar only on an interactive terminal and without --quiet."""
    return not quiet and console.is_terminal and not console.is_dumb_terminal


@contextmanager
def replay_progress(
    description: str,
    total_simulated_s: float | None = None,
    *,
    requests: int | None = None,
    quiet: bool = False,
    console: Console | None = None,
    delay_s: float = 0.5,
    refresh_s: float = 0.1,
) -> Iterator[ProgressHandle]:
    """A bar for one run (see the module docstring); on stderr unless given
    a console. The handle is a no-op when the bar is disabled."""
    out = console if console is not None else Console(stderr=True)
    if not progress_enabled(out, quiet=quiet):
        yield ProgressHandle()
        return
    bounded = bool(total_simulated_s) or bool(requests)
    columns: list[ProgressColumn] = [
        TextColumn("[progress.description]{task.description}", table_column=_no_wrap()),
        BarColumn(bar_width=24),
        _PercentColumn(),
        _CountsColumn(table_column=_no_wrap()),
        _SpeedColumn(table_column=_no_wrap()),
        TimeElapsedColumn(),
    ]
    if bounded:
        columns += [TextColumn("eta"), TimeRemainingColumn()]
    progress = Progress(
        *columns,
        console=out,
        auto_refresh=False,
        transient=False,
    )
    handle = _RichHandle(
        progress,
        description=description,
        total_s=total_simulated_s,
        requests=requests,
        delay_s=delay_s,
        refresh_s=refresh_s,
    )
    try:
        yield handle
    finally:
        handle.close()
