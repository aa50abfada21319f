"""SuperInfer paper check (docs/replay.md): tables, figures and what-if runs.

    python docs/replay/paper_check.py table DIR NAME
        Markdown table of TTFT / TBT / TPOT attainment per policy per rate from
        the `planner replay --json-out DIR/NAME_r<RPS>.json` files (plus the
        lvf what-if column from DIR/nf_NAME_r<RPS>.json when present).
    python docs/replay/paper_check.py plot DIR NAME OUT.png TITLE
        TTFT and TBT attainment against the request rate, one line per policy.
    python docs/replay/paper_check.py whatif TRACE [--variant V ...] [knobs]
        Replays TRACE with simulator or policy variants that are not in planner/
        (to attribute LVF's behaviour) and prints attainment, queue and KV
        statistics, including why the head of the waiting queue did not start.

What-if variants (combine with "+", e.g. lvf+nanfix+lagonly): fcfs, lvf,
waiting-first, swapped-first as shipped; freelink (transfers cost nothing),
nosit (a swapped-in request runs in the iteration that swaps it in), keepstart
(RUNNING VLT from the first admission, not the last resume), lagonly (only
lagging requests, VLT > 0, may trigger preemption; VLT = 0 ones fill free
blocks), nanfix (a ROTARY request with no token and no prefill progress gets
its arrival as last_token_s instead of NaN).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

POLICIES = ("fcfs", "lvf", "waiting-first", "swapped-first")
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
    head = "| RPS | " + " | ".join(f"{c} TTFT / TBT / TPOT" for c in columns) + " | lvf swap-outs |"
    lines = [head, "|" + "---|" * (len(columns) + 2)]
    for rate, metrics in points:
        cells = []
        for c in columns:
            m = metrics.get(c)
            cells.append(
                "-"
                if m is None
                else f"{_pct(m['ttft_attainment'])} / {_pct(m['tbt_attainment'])} / "
                f"{_pct(m['tpot_attainment'])}"
            )
        swaps = metrics["lvf"]["swap_outs"] if "lvf" in metrics else "-"
        lines.append(f"| {rate:g} | " + " | ".join(cells) + f" | {swaps:,} |")
    return "\n".join(lines)


def plot(directory: Path, name: str, out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = _points(directory, name)
    rates = [r for r, _ in points]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
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
    plt.close(fig)


# -- what-if runs -------------------------------------------------------------


def whatif(argv: list[str]) -> None:
    from planner.domain.requests import Slo
    from planner.domain.rotation import RotationParams
    from planner.replay.engine import Engine
    from planner.replay.metrics import summarize
    from planner.replay.schedulers import Lvf, blocks_needed, make_scheduler
    from planner.replay.setup import ReplayKnobs, build_setup
    from planner.replay.state import Phase
    from planner.trace.io import load_trace

    class FreeLink:
        def transfer_time_s(self, d2h: float, h2d: float, seg: float | None = None) -> float:
            return 0.0

    class ProbeEngine(Engine):
        """Records why the head of the waiting queue did not start."""

        blocked: dict[str, float]
        no_sit = False

        def _apply(self, plan: Any) -> tuple[int, int]:
            out = super()._apply(plan)
            if self.no_sit:
                for r in self.in_transit:
                    r.phase = Phase.RUNNING
                    r.run_start_s = self.now_s
                    self.running.append(r)
                self.in_transit = []
            self._reason = "none"
            if self.queued:
                head = self.queued[0]
                if len(self.running) + len(self.in_transit) >= self.config.max_running:
                    self._reason = "max_running"
                elif self._prefill_room() <= 0:
                    self._reason = "token budget"
                elif blocks_needed(head, self.config.block_size_tokens) > self.free_gpu:
                    self._reason = "kv"
                else:
                    self._reason = "token budget"
            return out

        def _iteration(self) -> None:
            before = self.now_s
            self._reason = "none"
            super()._iteration()
            self.blocked[self._reason] = self.blocked.get(self._reason, 0.0) + (self.now_s - before)

    class KeepStart(Lvf):
        def plan(self, view: Any) -> Any:
            saved = [(r, r.run_start_s) for r in view.running]
            for r in view.running:
                if not math.isnan(r.admitted_at_s):
                    r.run_start_s = r.admitted_at_s
            try:
                return super().plan(view)
            finally:
                for r, start in saved:
                    r.run_start_s = start

    class NanFix(Lvf):
        def plan(self, view: Any) -> Any:
            fixed = [
                r
                for r in view.rotary
                if not r.outcome.token_times_s and math.isnan(r.last_progress_s)
            ]
            for r in fixed:
                r.last_progress_s = r.arrival_s
            try:
                return super().plan(view)
            finally:
                for r in fixed:
                    r.last_progress_s = math.nan

    class LagOnly(Lvf):
        def plan(self, view: Any) -> Any:
            p = self.inputs.params
            lagging = [
                r for r in view.queued if view.now_s - r.arrival_s - p.beta_ttft * r.slo_ttft_s > 0
            ]
            fresh = [r for r in view.queued if r not in lagging]
            plan = super().plan(dataclasses.replace(view, queued=lagging))
            plan.start.extend(fresh)
            return plan

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
    first_arrival = min(t.arrival_s for t in trace)
    last_arrival = max(t.arrival_s for t in trace)
    # Prompt and output tokens arriving per second, each at the compute-bound
    # cost of one token: a lower bound of the compute the trace asks for.
    tokens = sum(t.prompt_tokens + t.output_tokens for t in trace)
    offered = tokens / (last_arrival - first_arrival) * setup.cost.constants.prefill_s_per_token
    print(f"offered compute >= {offered:.2f} s per s ({len(trace)} requests)")
    rows = []
    for variant in a.variant or ["fcfs", "lvf"]:
        parts = variant.split("+")
        link: Any = setup.link
        mixins: list[type] = []
        no_sit = False
        for part in parts[1:]:
            if part == "freelink":
                link = FreeLink()
            elif part == "nosit":
                no_sit = True
            else:
                mixins.append({"keepstart": KeepStart, "nanfix": NanFix, "lagonly": LagOnly}[part])
        scheduler = (
            type("Variant", tuple(mixins), {})(setup.rotation)
            if mixins
            else make_scheduler(parts[0], setup.rotation)
        )
        engine = ProbeEngine(setup.engine, scheduler, setup.cost, link, trace)
        engine.blocked = {}
        engine.no_sit = no_sit
        result = engine.run()
        m = summarize(result)
        tl = [s for s in result.timeline if s.time_s <= last_arrival]
        w = np.array([s.iteration_s for s in tl])
        kv = np.array([s.gpu_kv_blocks_used for s in tl]) / setup.engine.gpu_kv_blocks
        total = sum(engine.blocked.values()) or 1.0
        row = {
            "variant": variant,
            **m.to_json(),
            "kv_mean": float((kv * w).sum() / w.sum()),
            "kv_full_fraction": float((w * (kv >= 0.98)).sum() / w.sum()),
            "waiting_mean": float((np.array([s.waiting for s in tl]) * w).sum() / w.sum()),
            "rotary_mean": float((np.array([s.rotary for s in tl]) * w).sum() / w.sum()),
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
