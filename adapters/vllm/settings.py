"""The adapter's settings, read from vLLM's additional_config under the key
"planner" (`--additional-config '{"planner": {"target": "127.0.0.1:50051"}}'`).
Plain Python, no vLLM."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from planner.adapters.common.channel import PIPELINED_SENDS, PipelinedSend
from planner.adapters.common.link import DEFAULT_DEADLINE_S
from planner.adapters.common.security import ChannelSecurity

from planner.v1 import rotation_pb2

from .layer_offload_settings import LayerOffloadSettings

CONFIG_KEY = "planner"
SECURITY_KEYS = ("tls_ca", "tls_cert", "tls_key", "auth_token_file")
# The rotation policy by the names `planner replay --policy` uses.
VARIANTS = {
    "lvf": rotation_pb2.ROTATION_VARIANT_LVF,
    "lvf-paper": rotation_pb2.ROTATION_VARIANT_LVF_PAPER,
}
# The TBT SLO for Token-Deposit when slo_tbt_s is not set: the planner's own
# default for a snapshot without one (planner.domain.requests; a test holds
# them equal).
DEFAULT_TBT_SLO_S = 0.1
ROTATION_KEYS = ("variant", "preempt_slack_tbts", "resume_slack_tbts", "lost_slack_tbts")
# How each step's rotation plan is asked for: "pipelined" sends the call
# right after a step is scheduled and applies the answer at the next one
# (the call runs while the model computes); "synchronous" asks at the start
# of each step and waits for the answer (the call is on the critical path).
PIPELINED = "pipelined"
SYNCHRONOUS = "synchronous"
PLANNING_MODES = (PIPELINED, SYNCHRONOUS)
# When a plan's order of the waiting queue is applied: "with-preemption",
# only in a step where the plan also preempts (the requests it makes room
# for go first; otherwise vLLM's own order, since moving a request that
# fits ahead of an older one that does not measured worse than vLLM's
# first-come-first-served on every load tried, docs/adapters.md);
# "always", whenever the plan prioritizes anything.
REORDER_WITH_PREEMPTION = "with-preemption"
REORDER_ALWAYS = "always"
REORDER_MODES = (REORDER_WITH_PREEMPTION, REORDER_ALWAYS)
# How the swap connector handles a preemption vLLM makes on its own (the
# planner's preemptions are always swapped): "recompute", as vLLM without
# the plugin does (where the planner asked for nothing, the engine behaves
# as if the plugin were not there); "swap", copied out and back in like the
# planner's.
ENGINE_PREEMPTIONS_RECOMPUTE = "recompute"
ENGINE_PREEMPTIONS_SWAP = "swap"
ENGINE_PREEMPTION_MODES = (ENGINE_PREEMPTIONS_RECOMPUTE, ENGINE_PREEMPTIONS_SWAP)


@dataclass(frozen=True, slots=True)
class PlannerSettings:
    # "host:port" of a planner server; None runs the planner in process.
    target: str | None = None
    # Synchronous: the most a step waits for the planner. Pipelined: the
    # most a step waits for an answer sent for it a step earlier, counted
    # from when it was sent (a step longer than this never waits).
    deadline_s: float = DEFAULT_DEADLINE_S
    planning: str = PIPELINED
    # How a pipelined call goes out over gRPC (channel.PipelinedSend).
    pipelined_send: PipelinedSend = "sender-thread"
    # Request-level SLOs sent with every snapshot; None takes the planner's.
    slo_ttft_s: float | None = None
    slo_tbt_s: float | None = None
    # Layer offload (OrbitFlow) on when set.
    layer_offload: LayerOffloadSettings | None = None
    # The rotation policy's knobs sent with every snapshot (setting
    # "rotation": {"variant": "lvf" | "lvf-paper", "preempt_slack_tbts": ...,
    # "resume_slack_tbts": ..., "lost_slack_tbts": ...}); None: the planner's
    # defaults.
    rotation: rotation_pb2.RotationParams | None = None
    # TLS and bearer token of the channel to target (settings tls_ca,
    # tls_cert, tls_key, auth_token_file; the token also from
    # $PLANNER_AUTH_TOKEN), as for `planner call`.
    security: ChannelSecurity = field(default_factory=ChannelSecurity)
    # False: plans are asked for (and logged) but never applied, every step
    # is vLLM's own (what the adapter costs without what it decides).
    apply_plans: bool = True
    reorder: str = REORDER_WITH_PREEMPTION
    engine_preemptions: str = ENGINE_PREEMPTIONS_RECOMPUTE
    # A file that gets one JSON line per step with requests waiting
    # (decision_log.py); None: no log.
    decision_log: str | None = None
    # A file that gets each planner call's moments over gRPC, the adapter's
    # and the server's (planner.call_timing), one JSON line per call; None:
    # no log. A measurement aid: needs a target.
    call_timing_log: str | None = None

    @classmethod
    def from_additional_config(cls, additional: Any) -> PlannerSettings:
        raw = additional.get(CONFIG_KEY) if isinstance(additional, Mapping) else None
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise ValueError(f"additional_config.{CONFIG_KEY}: must be an object, got {raw!r}")
        known = {
            "target",
            "deadline_ms",
            "slo_ttft_s",
            "slo_tbt_s",
            "layer_offload",
            "rotation",
            "planning",
            "pipelined_send",
            "apply_plans",
            "reorder",
            "engine_preemptions",
            "decision_log",
            "call_timing_log",
            *SECURITY_KEYS,
        }
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(
                f"additional_config.{CONFIG_KEY}.{unknown[0]}: unknown setting "
                f"(known: {', '.join(sorted(known))})"
            )
        target = raw.get("target")
        if target is not None and (not isinstance(target, str) or ":" not in target):
            raise ValueError(f"additional_config.{CONFIG_KEY}.target: must be host:port")
        deadline_ms = _positive(raw, "deadline_ms")
        planning = raw.get("planning", PIPELINED)
        if planning not in PLANNING_MODES:
            raise ValueError(
                f"additional_config.{CONFIG_KEY}.planning: one of {', '.join(PLANNING_MODES)}, "
                f"got {planning!r}"
            )
        pipelined_send = raw.get("pipelined_send", "sender-thread")
        if pipelined_send not in PIPELINED_SENDS:
            raise ValueError(
                f"additional_config.{CONFIG_KEY}.pipelined_send: one of "
                f"{', '.join(PIPELINED_SENDS)}, got {pipelined_send!r}"
            )
        apply_plans = raw.get("apply_plans", True)
        if not isinstance(apply_plans, bool):
            raise ValueError(f"additional_config.{CONFIG_KEY}.apply_plans: must be true or false")
        reorder = raw.get("reorder", REORDER_WITH_PREEMPTION)
        if reorder not in REORDER_MODES:
            raise ValueError(
                f"additional_config.{CONFIG_KEY}.reorder: one of {', '.join(REORDER_MODES)}, "
                f"got {reorder!r}"
            )
        engine_preemptions = raw.get("engine_preemptions", ENGINE_PREEMPTIONS_RECOMPUTE)
        if engine_preemptions not in ENGINE_PREEMPTION_MODES:
            raise ValueError(
                f"additional_config.{CONFIG_KEY}.engine_preemptions: one of "
                f"{', '.join(ENGINE_PREEMPTION_MODES)}, got {engine_preemptions!r}"
            )
        call_timing_log = _path(raw, "call_timing_log")
        if call_timing_log is not None and target is None:
            raise ValueError(
                f"additional_config.{CONFIG_KEY}.call_timing_log: needs a target "
                "(in process there is no server to time)"
            )
        paths = {key: _path(raw, key) for key in SECURITY_KEYS}
        security = ChannelSecurity.from_settings(
            target, **paths, where=f"additional_config.{CONFIG_KEY}"
        )
        return cls(
            target=target,
            deadline_s=deadline_ms / 1e3 if deadline_ms is not None else DEFAULT_DEADLINE_S,
            planning=planning,
            pipelined_send=pipelined_send,
            slo_ttft_s=_positive(raw, "slo_ttft_s"),
            slo_tbt_s=_positive(raw, "slo_tbt_s"),
            layer_offload=LayerOffloadSettings.from_raw(raw["layer_offload"])
            if "layer_offload" in raw
            else None,
            rotation=_rotation(raw["rotation"]) if "rotation" in raw else None,
            security=security,
            apply_plans=apply_plans,
            reorder=reorder,
            engine_preemptions=engine_preemptions,
            decision_log=_path(raw, "decision_log"),
            call_timing_log=call_timing_log,
        )


def _rotation(raw: Any) -> rotation_pb2.RotationParams:
    where = f"additional_config.{CONFIG_KEY}.rotation"
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: must be an object, got {raw!r}")
    unknown = sorted(set(raw) - set(ROTATION_KEYS))
    if unknown:
        raise ValueError(
            f"{where}.{unknown[0]}: unknown setting (known: {', '.join(ROTATION_KEYS)})"
        )
    params = rotation_pb2.RotationParams()
    if "variant" in raw:
        variant = VARIANTS.get(raw["variant"]) if isinstance(raw["variant"], str) else None
        if variant is None:
            raise ValueError(
                f"{where}.variant: one of {', '.join(VARIANTS)}, got {raw['variant']!r}"
            )
        params.variant = variant
    for key in ROTATION_KEYS[1:]:
        if key not in raw:
            continue
        value = raw[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{where}.{key}: must be a number")
        setattr(params, key, float(value))
    return params


def _positive(raw: Mapping[str, Any], key: str) -> float | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"additional_config.{CONFIG_KEY}.{key}: must be a number > 0")
    return float(value)


def _path(raw: Mapping[str, Any], key: str) -> str | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ValueError(f"additional_config.{CONFIG_KEY}.{key}: must be a file path")
    return value
