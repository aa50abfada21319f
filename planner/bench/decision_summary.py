"""What the vLLM adapter's plans changed against vLLM's own policy, from the
decision logs `vllm_compare --decision-log` writes (one JSON line per step
with requests waiting, adapters/vllm/decision_log.py): steps by what was
done with the plan, the plan's preemptions against vLLM's own, and how often
the plan's first request was not the head of vLLM's waiting queue (it would
have jumped the queue).

    python -m planner.bench.decision_summary out/bench-vllm/*.decisions.jsonl
"""

from __future__ import annotations

import argparse
import collections
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass(slots=True)
class DecisionSummary:
    steps: int = 0
    # Steps by what was done with the plan (decision_log's values).
    by_outcome: dict[str, int] = field(default_factory=dict)
    plan_preemptions: int = 0
    engine_preemptions: int = 0
    # Steps whose plan put first a request that was not at the head of
    # vLLM's waiting queue, and how many of those were applied.
    jumps: int = 0
    jumps_applied: int = 0
    admitted: int = 0


def summarize(path: Path) -> DecisionSummary:
    out = DecisionSummary()
    outcomes: collections.Counter[str] = collections.Counter()
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            step = json.loads(line)
            out.steps += 1
            outcomes[step["applied"]] += 1
            planned = set(step["plan_preempted"] or ())
            if step["applied"] == "applied":
                out.plan_preemptions += len(planned)
                out.engine_preemptions += len(set(step["preempted"]) - planned)
            else:
                out.engine_preemptions += len(step["preempted"])
            first = step["prioritized"] or []
            if first and step["engine_order"] and first[0] != step["engine_order"][0]:
                out.jumps += 1
                out.jumps_applied += step["applied"] == "applied"
            out.admitted += len(step["admitted"])
    out.by_outcome = dict(outcomes)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="+", type=Path)
    args = parser.parse_args(argv)
    for path in args.logs:
        print(json.dumps({"log": str(path), **asdict(summarize(path))}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
