"""c2cserve's both-met attainment with the C2C link never oversubscribed
(docs/serverless.md, "The link's share: a bound"): the engine gives a pass
the link divided among the slices streaming when it starts and keeps that
share to its end, so the link may carry more than its bandwidth while
slices start streaming; here every streaming pass gets the fair share
(link / slices) whatever the others do, which never exceeds the link and
is never more than the engine's share. One JSON line per rate scale:
c2cserve as the engine runs it, c2cserve with the fair share, dedicated.

    .venv/bin/python docs/serverless/link_bound.py /tmp/sl/mtl.jsonl \
        --rate-scale 0.25 --rate-scale 1 --rate-scale 4
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from planner.domain.requests import Slo
from planner.replay.metrics import summarize
from planner.replay.serverless_engine import ServerlessEngine
from planner.replay.serverless_setup import ServerlessKnobs, serverless_config
from planner.replay.serverless_slices import Slice
from planner.replay.setup import DEFAULT_PROFILE, ReplayKnobs, build_setup, scale_rate
from planner.trace.io import load_trace


class FairShareEngine(ServerlessEngine):
    """Every streaming pass gets link / slices."""

    def _share(self, s: Slice) -> tuple[float, Sequence[Slice]]:
        share, others = super()._share(s)
        if not self._p.streams:
            return share, others
        return self.config.link_gbps / len(self._slices), others


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("trace")
    p.add_argument("--rate-scale", type=float, action="append", required=True)
    p.add_argument("--mig", default="3")
    p.add_argument("--slo-ttft", type=float, default=1.0)
    p.add_argument("--slo-tbt", type=float, default=0.25)
    args = p.parse_args()
    setup = build_setup(
        DEFAULT_PROFILE,
        ReplayKnobs(slo=Slo(ttft_s=args.slo_ttft, tbt_s=args.slo_tbt), max_running=64),
    )
    config = serverless_config(setup, ServerlessKnobs(mig=args.mig))
    trace = load_trace(args.trace, sort=True)
    runs: list[tuple[str, type[ServerlessEngine], str]] = [
        ("c2cserve", ServerlessEngine, "c2cserve"),
        ("c2cserve_fair_share", FairShareEngine, "c2cserve"),
        ("dedicated", ServerlessEngine, "dedicated"),
    ]
    for scale in args.rate_scale:
        scaled = scale_rate(trace, scale)
        row: dict[str, object] = {"scale": scale}
        for name, engine, policy in runs:
            both = summarize(engine(config, policy, scaled).run().result).both_attainment
            row[name] = None if both is None else round(100 * both, 1)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
