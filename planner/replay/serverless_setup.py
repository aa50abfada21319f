"""From a replay setup (the profile's model is every served model's
architecture, the SLOs) and the serverless knobs to a serverless run's
config (serverless_engine)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from planner.domain.serverless import PreemptionParams
from planner.profiles.errors import ProfileError
from planner.profiles.mig import GB, GH200_C2C_LINK, mig_layout
from planner.replay.serverless_engine import LOAD_LINKS, ServerlessConfig
from planner.replay.serverless_policies import SERVERLESS_POLICIES
from planner.replay.setup import ReplaySetup

# PCIe Gen5 x16 as measured (docs/serverless.md: 55 GB/s): dedicated's
# default weight-load link.
PCIE_GBPS = 55.0
DEFAULT_MIG = "3"
DEFAULT_SWITCH_SETUP_S = 0.05
# Preemption knobs (docs/serverless.md: chosen by measurement). A waiting
# model may preempt once its most urgent request has half its TTFT target of
# slack left (U) and a placement holds its place for half of it (Q); a
# victim needs the slack to wait for the starvation backstop to bring it
# back: W_s + Q + 1 s (V). The backstop (W_s: a model that has waited this
# long drains a place whatever the slack) is off by default, as in the
# paper: it bounds every wait but costs goodput whenever more models are
# active than the link can stream (docs/serverless.md has the numbers);
# --starve-after turns it on.
URGENT_SLACK_TTFT = 0.5
MIN_HOLD_TTFT = 0.5
STARVE_AFTER_S = math.inf
VICTIM_SLACK_MARGIN_S = 1.0
MAX_DRAIN_S = 10.0

# Shared slices: the residents' requests in flight together up to which a
# model may join (docs/serverless.md, "Saturation": chosen by measurement).
SHARE_MAX_IN_FLIGHT = 2
HOST_MEMORY_GB = 480 * 0.9

__all__ = ["DEFAULT_MIG", "DEFAULT_SWITCH_SETUP_S", "LOAD_LINKS", "PCIE_GBPS"]


@dataclass(frozen=True, slots=True)
class ServerlessKnobs:
    mig: str = DEFAULT_MIG
    c2c_gbps: float = GH200_C2C_LINK.sustained_gbps
    # None: each policy's default (dedicated PCIe, sllm and aegaeon C2C).
    load_link: str | None = None
    switch_setup_s: float = DEFAULT_SWITCH_SETUP_S
    replan_s: float = 10.0
    seed: int = 0
    # Coefficient of variation of the iteration-time noise (0: none).
    jitter_cv: float = 0.0
    max_models_per_slice: int = 2
    # c2cserve-light-share: the most requests in flight on a slice for a
    # model to join it.
    share_max_in_flight: int = SHARE_MAX_IN_FLIGHT
    # Disk read into host memory, GB/s (None: every model in host memory),
    # and the host memory that holds weights (GH200's 480 GB x 0.9).
    disk_gbps: float | None = None
    host_memory_gb: float = HOST_MEMORY_GB
    # U, Q, V and W_s (None: from the TTFT target).
    urgent_slack_s: float | None = None
    min_hold_s: float | None = None
    victim_slack_s: float | None = None
    starve_after_s: float | None = None
    max_drain_s: float | None = None


def _or(value: float | None, default: float) -> float:
    return value if value is not None else default


def serverless_config(setup: ReplaySetup, knobs: ServerlessKnobs) -> ServerlessConfig:
    """Raises ValueError naming the bad knob."""
    try:
        slices = tuple(mig_layout(knobs.mig))
    except ProfileError as exc:
        raise ValueError(f"--mig: {exc}") from None
    if knobs.load_link is not None and knobs.load_link not in LOAD_LINKS:
        raise ValueError(f"--load-link must be one of {', '.join(LOAD_LINKS)}")
    ttft = setup.engine.slo.ttft_s
    u = _or(knobs.urgent_slack_s, URGENT_SLACK_TTFT * ttft)
    q = _or(knobs.min_hold_s, MIN_HOLD_TTFT * ttft)
    starve = _or(knobs.starve_after_s, STARVE_AFTER_S)
    try:
        preemption = PreemptionParams(
            min_hold_s=q,
            urgent_slack_s=u,
            victim_slack_s=_or(knobs.victim_slack_s, starve + q + VICTIM_SLACK_MARGIN_S),
            starve_after_s=starve,
            max_drain_s=_or(knobs.max_drain_s, MAX_DRAIN_S),
        )
    except ValueError as exc:
        raise ValueError(f"serverless: {exc}") from None
    config = ServerlessConfig(
        slices=slices,
        model=setup.model,
        link_gbps=knobs.c2c_gbps,
        slo=setup.engine.slo,
        load_link=knobs.load_link,
        pcie_gbps=PCIE_GBPS,
        switch_setup_s=knobs.switch_setup_s,
        preemption=preemption,
        max_models_per_slice=knobs.max_models_per_slice,
        static_chunk=setup.engine.max_batched_tokens,
        max_running=setup.engine.max_running,
        replan_s=knobs.replan_s,
        seed=knobs.seed,
        jitter_cv=knobs.jitter_cv,
        share_max_in_flight=knobs.share_max_in_flight,
        disk_gbps=knobs.disk_gbps,
        host_memory_bytes=knobs.host_memory_gb * GB,
    )
    try:
        config.check()
    except ValueError as exc:
        raise ValueError(f"serverless: {exc}") from None
    return config


def describe(config: ServerlessConfig, policy: str) -> dict[str, object]:
    """What one run used, for its JSON ``config``."""
    p = SERVERLESS_POLICIES[policy]
    loads = not p.streams
    return {
        "mig": [s.name for s in config.slices],
        "c2c_gbps": config.link_gbps,
        "slo_ttft_s": config.slo.ttft_s,
        "slo_tbt_s": config.slo.tbt_s,
        "weights": "host memory, streamed over C2C" if p.streams else "HBM, loaded on a switch",
        "load_link": config.load_link_of(p) if loads else None,
        "load_gbps": config.load_gbps_of(p) if loads else None,
        "engine_init_s": (
            p.switch_profile.engine_init_s() if p.switch_profile is not None else 0.0
        ),
        "switch_setup_s": config.switch_setup_s if p.streams else None,
        "preempts": p.preempts,
        "max_models_per_slice": config.max_models_per_slice if p.shares else 1,
        "preemption": (
            {
                k: (v if math.isfinite(v) else None)
                for k, v in dataclasses.asdict(config.preemption).items()
            }
            if p.preempts
            else None
        ),
        "static_chunk": config.static_chunk,
        "max_running": config.max_running,
        "replan_s": config.replan_s,
        "compute_jitter_cv": config.jitter_cv,
        "share_max_in_flight": config.share_max_in_flight if p.shares_when_light else None,
        "disk_gbps": config.disk_gbps,
        "host_memory_gb": config.host_memory_bytes / GB if config.disk_gbps else None,
        "pipelined_load": p.pipelined_load if config.disk_gbps else None,
    }
