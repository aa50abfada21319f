"""vLLM's benchmark BurstGPT dataset (`vllm bench serve --dataset-name
burstgpt --dataset-path FILE.csv`): a CSV with BurstGPT's columns
Timestamp, Model, Request tokens, Response tokens, Total tokens, Log Type.

vLLM keeps only rows whose Model is "GPT-4" and builds a synthetic prompt of
exactly Request tokens token ids, asking for Response tokens: so every row
is written with Model GPT-4 and the lengths survive exactly. vLLM ignores
Timestamp and draws --num-prompts rows at random (with replacement when
more are asked for than there are rows), sending them at --request-rate
with --burstiness: arrivals and their order are ours only for a replay
through `planner trace import --format burstgpt`, which reads this file
back (Timestamp → arrival_s from the first row, Log Type → tenant). Log Type
is the request's tenant, or "Conversation log" when it has none.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from planner.trace.exporters.base import Exporter
from planner.trace.records import TraceRequest

VLLM_MODEL = "GPT-4"  # the only Model vLLM's BurstGPT loader keeps
DEFAULT_LOG_TYPE = "Conversation log"


def _rows(requests: Sequence[TraceRequest]) -> Iterator[Sequence[object]]:
    for r in requests:
        yield (
            repr(r.arrival_s),
            VLLM_MODEL,
            r.prompt_tokens,
            r.output_tokens,
            r.prompt_tokens + r.output_tokens,
            r.tenant or DEFAULT_LOG_TYPE,
        )


EXPORTER = Exporter(
    name="vllm-burstgpt",
    help="vLLM benchmark BurstGPT CSV (vllm bench serve --dataset-name burstgpt): exact "
    "lengths; vLLM samples rows at random and paces them by --request-rate",
    header=(
        "Timestamp",
        "Model",
        "Request tokens",
        "Response tokens",
        "Total tokens",
        "Log Type",
    ),
    rows=_rows,
    kept=("tenant",),
    notes=(
        "vllm bench serve ignores Timestamp (arrivals come from --request-rate and "
        "--burstiness) and samples rows at random; every row is written with Model GPT-4",
    ),
)
