"""Shared messages: SLOs and engine profiles."""

from __future__ import annotations

from planner.domain.requests import DEFAULT_TBT_SLO_S, DEFAULT_TTFT_SLO_S, Slo
from planner.profiles import HARDWARE_PROFILES, MODEL_PROFILES, HardwareProfile, ModelProfile
from planner.service.convert.checks import at_most, non_negative, positive
from planner.service.errors import InvalidArgumentError
from planner.v1 import common_pb2

# A latency target beyond a day is a unit mistake; bounding it keeps
# target x bandwidth products far inside int64.
MAX_SLO_S = 86_400.0


def slo_seconds(field: str, value: float) -> float:
    return at_most(field, positive(field, value), MAX_SLO_S, " s")


def slo_from_proto(field: str, msg: common_pb2.Slo) -> Slo:
    ttft = slo_seconds(f"{field}.ttft_s", msg.ttft_s) if msg.HasField("ttft_s") else None
    tbt = slo_seconds(f"{field}.tbt_s", msg.tbt_s) if msg.HasField("tbt_s") else None
    return Slo(
        ttft_s=DEFAULT_TTFT_SLO_S if ttft is None else ttft,
        tbt_s=DEFAULT_TBT_SLO_S if tbt is None else tbt,
    )


def model_from_proto(field: str, msg: common_pb2.EngineProfile) -> ModelProfile | None:
    which = msg.WhichOneof("model")
    if which is None:
        return None
    if which == "model_name":
        try:
            return MODEL_PROFILES[msg.model_name]
        except KeyError:
            known = ", ".join(sorted(MODEL_PROFILES))
            raise InvalidArgumentError(
                f"{field}.model_name", f"unknown model profile {msg.model_name!r} (known: {known})"
            ) from None
    m = msg.model_profile
    path = f"{field}.model_profile"
    for name in ("num_layers", "num_kv_heads", "head_dim", "kv_dtype_bytes"):
        positive(f"{path}.{name}", getattr(m, name))
    non_negative(f"{path}.param_bytes", m.param_bytes)
    return ModelProfile(
        name=m.name or "custom",
        num_layers=m.num_layers,
        num_kv_heads=m.num_kv_heads,
        head_dim=m.head_dim,
        kv_dtype_bytes=m.kv_dtype_bytes,
        param_bytes=m.param_bytes,
    )


def hardware_from_proto(field: str, msg: common_pb2.EngineProfile) -> HardwareProfile | None:
    which = msg.WhichOneof("hardware")
    if which is None:
        return None
    if which == "hardware_name":
        try:
            return HARDWARE_PROFILES[msg.hardware_name]
        except KeyError:
            known = ", ".join(sorted(HARDWARE_PROFILES))
            raise InvalidArgumentError(
                f"{field}.hardware_name",
                f"unknown hardware profile {msg.hardware_name!r} (known: {known})",
            ) from None
    h = msg.hardware_profile
    path = f"{field}.hardware_profile"
    non_negative(f"{path}.hbm_bytes", h.hbm_bytes)
    positive(f"{path}.h2d_gbps", h.h2d_gbps)
    positive(f"{path}.d2h_gbps", h.d2h_gbps)
    return HardwareProfile(
        name=h.name or "custom",
        hbm_bytes=h.hbm_bytes,
        h2d_gbps=h.h2d_gbps,
        d2h_gbps=h.d2h_gbps,
        full_duplex=h.full_duplex,
    )
