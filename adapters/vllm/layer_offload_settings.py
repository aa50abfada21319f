"""Settings of layer offload, read from additional_config.planner.layer_offload
(present = on). Plain Python, no vLLM."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from planner.adapters.common.offload_link import DEFAULT_OFFLOAD_DEADLINE_S

FIELD = "additional_config.planner.layer_offload"
KNOWN = {
    "layer_compute_ms",
    "link_blocks_per_s",
    "gpu_block_budget",
    "num_cpu_blocks",
    "deadline_ms",
    "engine_id",
    "token_deposit",
}


@dataclass(frozen=True, slots=True)
class LayerOffloadSettings:
    # comp_l: the first estimate of one decode step's compute per layer; the
    # planner's controller refines it from the measured timings.
    layer_compute_s: float
    # B: CPU -> GPU link in one-layer KV blocks per second (first estimate).
    link_blocks_per_s: float
    # B_GPU in one-layer blocks; None: vLLM's GPU blocks x layers.
    gpu_block_budget: int | None = None
    # CPU blocks (vLLM-sized, all layers) holding offloaded KV; None: as
    # many as vLLM's GPU blocks.
    num_cpu_blocks: int | None = None
    deadline_s: float = DEFAULT_OFFLOAD_DEADLINE_S
    engine_id: str = "vllm"
    # Token-Deposit on the output path for requests under a plan.
    token_deposit: bool = True

    @classmethod
    def from_raw(cls, raw: Any) -> LayerOffloadSettings:
        if not isinstance(raw, Mapping):
            raise ValueError(f"{FIELD}: must be an object, got {raw!r}")
        unknown = sorted(set(raw) - KNOWN)
        if unknown:
            raise ValueError(
                f"{FIELD}.{unknown[0]}: unknown setting (known: {', '.join(sorted(KNOWN))})"
            )
        engine_id = raw.get("engine_id", "vllm")
        if not isinstance(engine_id, str) or not engine_id:
            raise ValueError(f"{FIELD}.engine_id: must be a non-empty string")
        token_deposit = raw.get("token_deposit", True)
        if not isinstance(token_deposit, bool):
            raise ValueError(f"{FIELD}.token_deposit: must be true or false")
        deadline_ms = _number(raw, "deadline_ms")
        return cls(
            layer_compute_s=_required(raw, "layer_compute_ms") / 1e3,
            link_blocks_per_s=_required(raw, "link_blocks_per_s"),
            gpu_block_budget=_count(raw, "gpu_block_budget"),
            num_cpu_blocks=_count(raw, "num_cpu_blocks"),
            deadline_s=deadline_ms / 1e3 if deadline_ms is not None else DEFAULT_OFFLOAD_DEADLINE_S,
            engine_id=engine_id,
            token_deposit=token_deposit,
        )


def _required(raw: Mapping[str, Any], key: str) -> float:
    value = _number(raw, key)
    if value is None:
        raise ValueError(f"{FIELD}.{key}: required, a number > 0")
    return value


def _number(raw: Mapping[str, Any], key: str) -> float | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{FIELD}.{key}: must be a number > 0, got {value!r}")
    return float(value)


def _count(raw: Mapping[str, Any], key: str) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{FIELD}.{key}: must be an integer > 0, got {value!r}")
    return value
