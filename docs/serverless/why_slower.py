"""Where a serverless policy's decode time goes, iteration by iteration and
switch by switch (docs/serverless.md, "Saturation"): for each policy at each
rate scale, the decode iterations split by how much of the model's weights
were resident in HBM (all / part / none) with their mean time, the
iterations run while another model shared the slice, the switches (and how
many preempted a model with requests in flight), and tokens/s.

    .venv/bin/python docs/serverless/why_slower.py /tmp/sl/mtl.jsonl \
        --policy c2cserve --policy dedicated --rate-scale 2 --rate-scale 4
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, replace

import numpy as np

from planner.domain.requests import Slo
from planner.replay.serverless_engine import ServerlessEngine
from planner.replay.serverless_setup import ServerlessKnobs, serverless_config
from planner.replay.serverless_slices import NOBODY, Slice
from planner.replay.setup import ReplayKnobs, build_setup, scale_rate
from planner.trace.io import load_trace


@dataclass
class Iterations:
    # (resident fraction, residents on the slice, decodes, prefilling, seconds,
    # residents with requests in flight)
    rows: list[tuple[float, int, int, int, float]] = field(default_factory=list)


def instrumented(engine: ServerlessEngine, log: Iterations) -> None:
    """Record every iteration ``engine`` runs (its model's resident
    fraction, the slice's residents, its decodes and time)."""
    inner = engine._iterate
    weight = engine._weight_bytes

    def step(s: Slice, now: float) -> None:
        before = engine._iterations
        snapshot = [(r.model, r.resident_bytes, len(r.running)) for r in s.residents]
        active = sum(1 for r in s.residents if r.in_flight)
        inner(s, now)
        if engine._iterations == before:
            return
        r = engine._residency[s.index].turn.resident
        if r is NOBODY:
            return
        frac = next((b for m, b, _ in snapshot if m == r.model), r.resident_bytes) / weight
        decodes = next((n for m, _, n in snapshot if m == r.model), 0)
        prefill = 1 if r.queue and r.queue[0].prefilled > 0 else 0
        log.rows.append((frac, len(snapshot), decodes, prefill, s.iter_end_s - now, active))

    engine._iterate = step  # type: ignore[method-assign]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace")
    p.add_argument("--policy", action="append", required=True)
    p.add_argument("--rate-scale", type=float, action="append", required=True)
    p.add_argument("--mig", default="3")
    p.add_argument("--slo-ttft", type=float, default=1.0)
    p.add_argument("--slo-tbt", type=float, default=0.25)
    args = p.parse_args()
    setup = build_setup(
        "llama-3-8b@h100-sxm-80gb",
        ReplayKnobs(slo=Slo(ttft_s=args.slo_ttft, tbt_s=args.slo_tbt)),
    )
    config = serverless_config(setup, replace(ServerlessKnobs(), mig=args.mig))
    trace = load_trace(args.trace, sort=True)
    print(
        "policy | scale | tokens/s | decode iters all / part / none resident "
        "(mean ms) | iters shared | switches (preempting) | loaded | kv swaps | sheds"
    )
    for scale in args.rate_scale:
        scaled = scale_rate(trace, scale)
        for name in args.policy:
            engine = ServerlessEngine(config, name, scaled)
            log = Iterations()
            instrumented(engine, log)
            run = engine.run()
            rows = np.array(log.rows) if log.rows else np.zeros((0, 6))
            decode = rows[(rows[:, 2] > 0)] if len(rows) else rows
            cells = []
            for lo, hi in ((0.999, 2.0), (1e-9, 0.999), (-1.0, 1e-9)):
                part = decode[(decode[:, 0] >= lo) & (decode[:, 0] < hi)] if len(decode) else decode
                mean = 1e3 * part[:, 4].mean() if len(part) else float("nan")
                cells.append(f"{len(part)} ({mean:.0f})")
            shared = int((rows[:, 1] > 1).sum()) if len(rows) else 0
            idle_sharer = (
                int(((rows[:, 1] > 1) & (rows[:, 5] < rows[:, 1])).sum()) if len(rows) else 0
            )
            tokens = sum(len(o.token_times_s) for o in run.result.requests)
            span = run.stats.span_s
            preempting = sum(1 for w in run.switches if w.preempted)
            top_ups = run.stats.load_bytes
            print(
                f"{name} | x{scale:g} | {tokens / span:.1f} | {' / '.join(cells)} | "
                f"{shared} of {len(rows)} ({idle_sharer} next to an idle sharer) | "
                f"{run.stats.switches} ({preempting}) | "
                f"{top_ups / 1e9:.0f} GB loaded | {run.stats.kv_swaps} | {run.stats.sheds}"
            )


if __name__ == "__main__":
    main()
