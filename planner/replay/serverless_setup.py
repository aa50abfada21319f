"""From a replay setup (the profile's model is every served model's
architecture, the SLOs) and the serverless knobs to a serverless run's
config (serverless_engine)."""

from __future__ import annotations

from dataclasses import dataclass

from planner.profiles.errors import ProfileError
from planner.profiles.mig import GH200_C2C_LINK, mig_layout
from planner.replay.serverless_engine import ServerlessConfig
from planner.replay.setup import ReplaySetup

# The weight-loading links of the dedicated baseline: PCIe Gen5 x16 as
# measured (docs/serverless.md: 55 GB/s) and GH200's C2C, sustained.
PCIE_GBPS = 55.0
LOAD_LINKS = ("pcie", "c2c")
DEFAULT_MIG = "3"
DEFAULT_SWITCH_SETUP_S = 0.05


@dataclass(frozen=True, slots=True)
class ServerlessKnobs:
    mig: str = DEFAULT_MIG
    c2c_gbps: float = GH200_C2C_LINK.sustained_gbps
    load_link: str = "pcie"
    switch_setup_s: float = DEFAULT_SWITCH_SETUP_S
    replan_s: float = 10.0
    seed: int = 0


def serverless_config(setup: ReplaySetup, knobs: ServerlessKnobs) -> ServerlessConfig:
    """Raises ValueError naming the bad knob."""
    try:
        slices = tuple(mig_layout(knobs.mig))
    except ProfileError as exc:
        raise ValueError(f"--mig: {exc}") from None
    if knobs.load_link not in LOAD_LINKS:
        raise ValueError(f"--load-link must be one of {', '.join(LOAD_LINKS)}")
    load_gbps = PCIE_GBPS if knobs.load_link == "pcie" else knobs.c2c_gbps
    config = ServerlessConfig(
        slices=slices,
        model=setup.model,
        link_gbps=knobs.c2c_gbps,
        load_link=knobs.load_link,
        load_gbps=load_gbps,
        slo=setup.engine.slo,
        switch_setup_s=knobs.switch_setup_s,
        static_chunk=setup.engine.max_batched_tokens,
        max_running=setup.engine.max_running,
        replan_s=knobs.replan_s,
        seed=knobs.seed,
    )
    config.check()
    return config
