"""Where the planner calls over a deadline lost their time: reads per-call
timing logs (the adapter's `call_timing_log`, planner.call_timing: the
caller's and the server's moments of each gRPC call on one host) and cuts
every call into hand-over (engine thread to sending thread), inbound
(serialization, transport, the server's polling thread waking), server queue
(the hand-over to a worker thread, which then asks the polling thread for the
request message and waits for it), handler (the planner's
work) and outbound (serialization, transport, the caller's thread waking).
For all calls and for the calls over the deadline: each part's median, p99
and mean, and for the calls over the deadline which part was the largest.

    python -m planner.bench.call_timing_report FILE.jsonl [...] [--deadline-ms 5]
        [--handler-saving-ms 0.15] [--json]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from planner.call_timing import CallTiming

PARTS = ("hand_over", "inbound", "server_queue", "handler", "outbound")


@dataclass(frozen=True, slots=True)
class PartStats:
    p50_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float

    @staticmethod
    def of(values: list[float]) -> PartStats:
        if not values:
            return PartStats(*(float("nan"),) * 4)
        a = np.asarray(values)
        return PartStats(
            float(np.percentile(a, 50)),
            float(np.percentile(a, 99)),
            float(a.mean()),
            float(a.max()),
        )


@dataclass(frozen=True, slots=True)
class TimingReport:
    calls: int
    # Calls the server sent its moments for (answered ones).
    timed: int
    deadline_ms: float
    over: int
    parts: dict[str, PartStats]
    parts_over: dict[str, PartStats]
    # Over-deadline calls by their largest part.
    largest_over: dict[str, int]
    # Calls that would still be over the deadline with a handler taking no
    # time (what no change to the planner's own work can save).
    over_without_handler: int
    # With each handler handler_saving_ms shorter (not below 0): what a
    # lighter planner call (a smaller snapshot to convert) could save.
    handler_saving_ms: float
    over_with_saving: int

    def to_json(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "timed": self.timed,
            "deadline_ms": self.deadline_ms,
            "over": self.over,
            "over_pct": 100 * self.over / self.calls if self.calls else float("nan"),
            "parts": {k: vars_of(v) for k, v in self.parts.items()},
            "parts_over": {k: vars_of(v) for k, v in self.parts_over.items()},
            "largest_over": self.largest_over,
            "over_without_handler": self.over_without_handler,
            "handler_saving_ms": self.handler_saving_ms,
            "over_with_saving": self.over_with_saving,
        }


def vars_of(stats: PartStats) -> dict[str, float]:
    return {
        "p50_ms": stats.p50_ms,
        "p99_ms": stats.p99_ms,
        "mean_ms": stats.mean_ms,
        "max_ms": stats.max_ms,
    }


def read_timings(paths: list[Path]) -> list[CallTiming]:
    out = []
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                out.append(CallTiming.from_json(json.loads(line)))
    return out


def report(
    timings: list[CallTiming], deadline_ms: float, handler_saving_ms: float = 0.0
) -> TimingReport:
    cut = [t.parts_ms() for t in timings]
    over = [p for p in cut if p["total"] > deadline_ms]
    timed = [p for p in cut if "handler" in p]
    names = ("total", *PARTS)

    def stats(rows: list[dict[str, float]]) -> dict[str, PartStats]:
        return {n: PartStats.of([r[n] for r in rows if n in r]) for n in names}

    largest = dict.fromkeys(PARTS, 0)
    for p in over:
        if "handler" in p:
            largest[max(PARTS, key=lambda n: p[n])] += 1
    return TimingReport(
        calls=len(cut),
        timed=len(timed),
        deadline_ms=deadline_ms,
        over=len(over),
        parts=stats(cut),
        parts_over=stats(over),
        largest_over=largest,
        over_without_handler=sum(p["total"] - p.get("handler", 0.0) > deadline_ms for p in over),
        handler_saving_ms=handler_saving_ms,
        over_with_saving=sum(
            p["total"] - min(handler_saving_ms, p.get("handler", 0.0)) > deadline_ms for p in over
        ),
    )


def markdown(r: TimingReport) -> str:
    share = f"{100 * r.over / r.calls:.2f} %" if r.calls else "-"
    lines = [
        f"{r.calls} calls ({r.timed} with the server's moments), {r.over} ({share}) over "
        f"{r.deadline_ms:g} ms; {r.over_with_saving} of them would still be with each "
        f"handler {r.handler_saving_ms:g} ms shorter, {r.over_without_handler} with a handler "
        "that took no time.",
        "",
        "| part | all calls: p50 / p99 / mean / max ms | calls over the deadline: p50 / p99 / "
        "mean / max ms | largest part of a call over the deadline |",
        "|---|---|---|---|",
    ]
    for name in ("total", *PARTS):
        a, o = r.parts[name], r.parts_over[name]
        lines.append(
            f"| {name.replace('_', ' ')} | {a.p50_ms:.3f} / {a.p99_ms:.3f} / {a.mean_ms:.3f} / "
            f"{a.max_ms:.3f} | {o.p50_ms:.3f} / {o.p99_ms:.3f} / {o.mean_ms:.3f} / "
            f"{o.max_ms:.3f} | {r.largest_over.get(name, '-')} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--deadline-ms", type=float, default=5.0)
    parser.add_argument(
        "--handler-saving-ms",
        type=float,
        default=0.0,
        help="also count the calls still over the deadline with each handler this much shorter",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    r = report(read_timings(args.files), args.deadline_ms, args.handler_saving_ms)
    print(json.dumps(r.to_json()) if args.json else markdown(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
