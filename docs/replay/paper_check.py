"""SuperInfer paper check (docs/replay.md): tables, figures and what-if runs.

    python docs/replay/paper_check.py table DIR NAME
        Markdown table of both-met / TTFT / TBT / TPOT attainment per policy per rate from
        the `planner replay --json-out DIR/NAME_r<RPS>.json` files (plus the
        lvf what-if column from DIR/nf_NAME_r<RPS>.json when present).
    python docs/replay/paper_check.py plot DIR NAME OUT.png TITLE
        TTFT and TBT attainment against the request rate, one line per policy.
    python docs/replay/paper_check.py whatif TRACE [--variant V ...] [knobs]
        Replays TRACE with simulator or policy variants that are not in planner/
        (to attribute LVF's behaviour) and prints attainment, queue and KV
        statistics, including why the head of the waiting queue did not start.

What-if variants (combine with "+", e.g. lvf+freelink+lagonly): fcfs, lvf,
waiting-first, swapped-first as shipped; freelink (transfers cost nothing),
nosit (a swapped-in request runs in the iteration that swaps it in), keepstart
(RUNNING VLT from the first admission, not the last resume), lagonly (only
lagging requests, VLT > 0, may trigger preemption; VLT = 0 ones fill free
blocks), nanfix (a no-op, kept so that the documented command lines still run:
the fix is shipped since 14a4c0e, where a request preempted before computing
anything re-queues and a ROTARY request without a token uses its last prefill
chunk, else its arrival, as last_token_s; before it, such a request had a NaN
VLT and LVF never picked it again, and this variant gave it its arrival).
freelink, nosit and nanfix apply to any base policy; keepstart and lagonly
change LVF's decision and need lvf as the base.

The variants are subclasses of the replay engine and of the LVF scheduler made
at run time (make_variant); nothing under planner/ knows them.
tests/replay/test_paper_check_script.py runs them, so an engine change that
breaks them fails there.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from planner.domain.requests import Slo
from planner.domain.rotation import RotationParams
from planner.replay.engine import Engine
from planner.replay.metrics import summarize
from planner.replay.scheduler_by_name import make_scheduler
from planner.replay.schedulers import EngineView, Lvf, SchedulePlan
from planner.replay.setup import ReplayKnobs, build_setup
from planner.trace.io import load_trace

POLICIES = ("fcfs", "lvf-paper", "lvf", "waiting-first", "swapped-first")
RATE = re.compile(r"_r([\d.]+)\.json$")


# -- tables and figures -------------------------------------------------------


def _points(directory: Path, name: str) -> list[tuple[float, dict[str, dict[str, Any]]]]:
    points = []
    for path in directory.glob(f"{name}_r*.json"):
        match = RATE.search(path.name)
        if match is None:
            continue
        data = json.loads(path.read_text())
        by_policy = {p["policy"]: p["metrics"] for p in data["policies"]}
        whatif = directory / f"nf_{path.name}"
        if whatif.exists():
            for row in json.loads(whatif.read_text()):
                by_policy.setdefault(row["variant"], row)
        points.append((float(match.group(1)), by_policy))
    return sorted(points, key=lambda p: p[0])


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def table(directory: Path, name: str) -> str:
    points = _points(directory, name)
    columns = [p for p in (*POLICIES, "lvf+nanfix") if any(p in m for _, m in points)]
    rotating = [c for c in ("lvf-paper", "lvf") if c in columns]
    head = (
        "| RPS | "
        + " | ".join(f"{c} both / TTFT / TBT / TPOT" for c in columns)
        + "".join(f" | {c} swap-outs" for c in rotating)
        + " |"
    )
    lines = [head, "|" + "---|" * (len(columns) + len(rotating) + 1)]
    for rate, metrics in points:
        cells = []
        for c in columns:
            m = metrics.get(c)
            cells.append(
                "-"
                if m is None
                else f"{_pct(m.get('both_attainment'))} / {_pct(m['ttft_attainment'])} / "
                f"{_pct(m['tbt_attainment'])} / {_pct(m['tpot_attainment'])}"
            )
        swaps = [f"{metrics[c]['swap_outs']:,}" if c in metrics else "-" for c in rotating]
        lines.append(f"| {rate:g} | " + " | ".join(cells + swaps) + " |")
    return "\n".join(lines)


def plot(directory: Path, name: str, out: Path, title: str) -> None:
    points = _points(directory, name)
    rates = [r for r, _ in points]
    fig = Figure(figsize=(9, 3.6))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2, sharey=True)
    styles = {
        "fcfs": ("tab:blue", "-", "o"),
        "lvf": ("tab:red", "-", "s"),
        "waiting-first": ("tab:green", "-", "^"),
        "swapped-first": ("tab:purple", "-", "v"),
        "lvf+nanfix": ("tab:red", ":", "x"),
    }
    for ax, key, label in (
        (axes[0], "ttft_attainment", "TTFT attainment (SLO 5 s)"),
        (axes[1], "tbt_attainment", "TBT attainment, token level (SLO 100 ms)"),
    ):
        for policy, (color, line, marker) in styles.items():
            ys = [m[policy][key] if policy in m else math.nan for _, m in points]
            if all(math.isnan(y) for y in ys):
                continue
            legend = "lvf with NaN fix (what-if)" if policy == "lvf+nanfix" else policy
            ax.plot(rates, ys, line, color=color, marker=marker, ms=4, label=legend)
        ax.set_title(label, fontsize="medium")
        ax.set_xlabel("Request rate (requests/s, 120 s of Poisson arrivals)")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("SLO attainment")
    axes[0].legend(fontsize="small", loc="lower left")
    fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)


# -- what-if runs -------------------------------------------------------------

# Variant parts after the base policy ("lvf+freelink+lagonly").
ENGINE_PARTS = ("freelink", "nosit", "nanfix")  # any base policy
LVF_PARTS = ("keepstart", "lagonly")  # change LVF's decision: lvf only


def parse_variant(variant: str) -> tuple[str, list[str]]:
    """The base policy and the parts of a variant ("lvf+freelink+lagonly").
    Raises ValueError for an unknown one."""
    base, *parts = variant.split("+")
    if base not in POLICIES:
        raise ValueError(f"unknown base policy {base!r} in {variant!r} (known: {POLICIES})")
    for part in parts:
        if part in LVF_PARTS and base != "lvf":
            raise ValueError(f"{part} changes LVF's decision: lvf+{part}, not {variant!r}")
        if part not in ENGINE_PARTS and part not in LVF_PARTS:
            known = ", ".join((*ENGINE_PARTS, *LVF_PARTS))
            raise ValueError(f"unknown variant part {part!r} in {variant!r} (known: {known})")
    return base, parts


def make_variant(variant: str, setup: Any, trace: Any) -> Any:
    """An engine (a subclass of planner.replay.engine.Engine that records why
    the head of the waiting queue did not start) running the variant on
    trace, ready to run(). Raises ValueError for an unknown variant."""

    class FreeLink:
        def transfer_time_s(self, d2h: float, h2d: float, seg: float | None = None) -> float:
            return 0.0

    class ProbeEngine(Engine):
        """Records, per iteration, why the head of the waiting queue did not
        start (after the plan is carried out), weighted by the iteration's
        duration; nosit: requests swapped in run in the same iteration."""

        def __init__(self, *args: Any, no_sit: bool = False) -> None:
            super().__init__(*args)
            self.no_sit = no_sit
            self.blocked: dict[str, float] = {}
            self._reason = "none"

        def _apply(self, plan: SchedulePlan) -> tuple[int, int]:
            out = super()._apply(plan)
            if self.no_sit:
                # What start_running does at the next iteration, now: the
                # swapped-in requests decode in this iteration's batch.
                self.state.start_running(self.now_s)
            self._reason = self._head_blocked_by()
            return out

        def _head_blocked_by(self) -> str:
            s = self.state
            if not len(s.queued.rows):
                return "none"
            head = int(s.queued.rows[0])
            if len(s.running.rows) + len(s.in_transit.rows) >= self.config.max_running:
                return "max_running"
            if self._prefill_room() <= 0:
                return "token budget"
            if int(self.requests.start_blocks[head]) > s.free_gpu:
                return "kv"
            return "token budget"

        def _count(self, reason: str, seconds: float) -> None:
            self.blocked[reason] = self.blocked.get(reason, 0.0) + seconds

        def _iteration(self) -> None:
            before = self.now_s
            self._reason = "none"
            super()._iteration()
            self._count(self._reason, self.now_s - before)

        def _quiet_stretch(self, progress: Any) -> bool:
            # Quiet iterations (nobody queued) that the engine runs in one
            # step: the head blocked by nothing.
            before = self.now_s
            ran = super()._quiet_stretch(progress)
            if ran:
                self._count("none", self.now_s - before)
            return ran

    class KeepStart(Lvf):
        """RUNNING VLT from the latest admission from the queue (the first,
        unless preempted by recompute) instead of the last resume."""

        def plan(self, view: EngineView) -> SchedulePlan:
            r, rows = view.requests, view.running
            saved = r.run_start_s[rows]
            admitted = r.admitted_at_s[rows]
            r.run_start_s[rows] = np.where(np.isnan(admitted), saved, admitted)
            try:
                return super().plan(view)
            finally:
                r.run_start_s[rows] = saved

    class LagOnly(Lvf):
        """Only lagging waiting requests (VLT > 0) take part in the decision
        (and may trigger preemption); the others follow its list in queue
        order and start if blocks are free."""

        def plan(self, view: EngineView) -> SchedulePlan:
            p = self.inputs.params
            r, queued = view.requests, view.queued
            lagging = view.now_s - r.arrival_s[queued] - p.beta_ttft * r.slo_ttft_s[queued] > 0
            if lagging.all():
                return super().plan(view)
            plan = super().plan(view._replace(queued=queued[lagging]))
            return plan._replace(start=np.concatenate((plan.start, queued[~lagging])))

    base, parts = parse_variant(variant)
    link: Any = FreeLink() if "freelink" in parts else setup.link
    # nanfix: shipped since 14a4c0e, nothing to change (module docstring).
    lvf_parts = {"keepstart": KeepStart, "lagonly": LagOnly}
    mixins = [lvf_parts[part] for part in parts if part in lvf_parts]
    scheduler = (
        type("Variant", tuple(mixins), {})(setup.rotation)
        if mixins
        else make_scheduler(base, setup.rotation)
    )
    return ProbeEngine(setup.engine, scheduler, setup.cost, link, trace, no_sit="nosit" in parts)


def whatif(argv: list[str]) -> list[dict[str, Any]]:
    """Runs the variants; prints one line each and returns their rows (the
    --json-out content)."""
    ap = argparse.ArgumentParser(prog="paper_check.py whatif")
    ap.add_argument("trace")
    ap.add_argument("--variant", action="append")
    ap.add_argument("--profile", default="qwen2.5-32b@gh200-144gb")
    ap.add_argument("--alpha", type=float, default=3.0)
    ap.add_argument("--beta-tbt", type=float, default=0.0)
    ap.add_argument("--beta-ttft", type=float, default=0.5)
    ap.add_argument("--transfer-budget-blocks", type=int)
    ap.add_argument("--max-batched-tokens", type=int, default=2048)
    ap.add_argument("--max-running", type=int, default=256)
    ap.add_argument("--cpu-kv-gb", type=float)
    ap.add_argument("--json-out", type=Path)
    a = ap.parse_args(argv)
    knobs = ReplayKnobs(
        slo=Slo(ttft_s=5.0, tbt_s=0.1),
        rotation=RotationParams(
            alpha=a.alpha,
            beta_tbt=a.beta_tbt,
            beta_ttft=a.beta_ttft,
            transfer_budget_blocks=a.transfer_budget_blocks,
        ),
        max_batched_tokens=a.max_batched_tokens,
        max_running=a.max_running,
        cpu_kv_bytes=int(a.cpu_kv_gb * 1e9) if a.cpu_kv_gb is not None else None,
    )
    setup = build_setup(a.profile, knobs)
    trace = load_trace(a.trace)
    variants = a.variant or ["fcfs", "lvf"]
    for variant in variants:  # every name checked before the first run
        try:
            parse_variant(variant)
        except ValueError as exc:
            ap.error(str(exc))
    first_arrival = min(t.arrival_s for t in trace)
    last_arrival = max(t.arrival_s for t in trace)
    # Prompt and output tokens arriving per second, each at the compute-bound
    # cost of one token: a lower bound of the compute the trace asks for.
    tokens = sum(t.prompt_tokens + t.output_tokens for t in trace)
    span = last_arrival - first_arrival
    offered = tokens / span * setup.cost.constants.prefill_s_per_token if span > 0 else math.nan
    print(f"offered compute >= {offered:.2f} s per s ({len(trace)} requests)")
    rows = []
    for variant in variants:
        engine = make_variant(variant, setup, trace)
        result = engine.run()
        m = summarize(result)
        tl = [s for s in result.timeline if s.time_s <= last_arrival]
        w = np.array([s.iteration_s for s in tl])
        kv = np.array([s.gpu_kv_blocks_used for s in tl]) / setup.engine.gpu_kv_blocks

        def mean(values: Any, w: Any = w) -> float:
            return float((values * w).sum() / w.sum()) if w.sum() > 0 else math.nan

        total = sum(engine.blocked.values()) or 1.0
        row = {
            "variant": variant,
            **m.to_json(),
            "kv_mean": mean(kv),
            "kv_full_fraction": mean(kv >= 0.98),
            "waiting_mean": mean(np.array([s.waiting for s in tl])),
            "rotary_mean": mean(np.array([s.rotary for s in tl])),
            "head_blocked_by": {k: v / total for k, v in sorted(engine.blocked.items())},
            "offered_compute_s_per_s": offered,
        }
        rows.append(row)
        blocked = ", ".join(f"{k} {v:.2f}" for k, v in row["head_blocked_by"].items())
        print(
            f"{variant:28s} TTFT {_pct(m.ttft_attainment)} TBT {_pct(m.tbt_attainment)} "
            f"TPOT {_pct(m.tpot_attainment)} | TTFT p50/p99 {m.ttft_s.p50:.2f}/{m.ttft_s.p99:.1f} s"
            f" TBT p99 {m.tbt_s.p99:.3f} s | req/s {m.throughput_req_s:.2f} swap-outs "
            f"{m.swap_outs} stall {_pct(m.stall_fraction)}% | KV mean {row['kv_mean']:.2f} "
            f"full {row['kv_full_fraction']:.2f} waiting {row['waiting_mean']:.0f} "
            f"rotary {row['rotary_mean']:.0f} | head blocked: {blocked}",
            flush=True,
        )
    if a.json_out is not None:
        a.json_out.write_text(json.dumps(rows, default=str))
    return rows


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in ("table", "plot", "whatif"):
        sys.exit(__doc__)
    command, rest = sys.argv[1], sys.argv[2:]
    if command == "table":
        print(table(Path(rest[0]), rest[1]))
    elif command == "plot":
        plot(Path(rest[0]), rest[1], Path(rest[2]), rest[3])
    else:
        whatif(rest)


if __name__ == "__main__":
    main()
