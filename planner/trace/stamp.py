"""Fields set on every request of a generated or imported trace: the model
where the source names none, SLOs, and ids."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from planner.trace.errors import SpecError
from planner.trace.records import TraceRequest


@dataclass(frozen=True, slots=True)
class Stamp:
    model: str | None = None  # only where a request has none
    tenant: str | None = None  # only where a request has none
    slo_ttft_s: float | None = None
    slo_tbt_s: float | None = None
    id_prefix: str | None = None  # ids PREFIX0, PREFIX1, ... in trace order

    def __post_init__(self) -> None:
        for option, value in (("--slo-ttft-s", self.slo_ttft_s), ("--slo-tbt-s", self.slo_tbt_s)):
            if value is not None and not (math.isfinite(value) and value > 0):
                raise SpecError(option, f"must be a finite number > 0, got {value}")
        for option, text in (("--model", self.model), ("--tenant", self.tenant)):
            if text is not None and not text:
                raise SpecError(option, "must not be empty")

    def apply(self, requests: list[TraceRequest]) -> list[TraceRequest]:
        out: list[TraceRequest] = []
        for index, request in enumerate(requests):
            changes: dict[str, object] = {}
            if self.model is not None and request.model is None:
                changes["model"] = self.model
            if self.tenant is not None and request.tenant is None:
                changes["tenant"] = self.tenant
            if self.slo_ttft_s is not None:
                changes["slo_ttft_s"] = self.slo_ttft_s
            if self.slo_tbt_s is not None:
                changes["slo_tbt_s"] = self.slo_tbt_s
            if self.id_prefix is not None:
                changes["id"] = f"{self.id_prefix}{index}"
            out.append(dataclasses.replace(request, **changes) if changes else request)  # type: ignore[arg-type]
        return out
