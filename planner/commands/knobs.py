"""The replay's knobs, described once: one dataclass of settings per
topology plus the shared ones. Each field is a knob: its name is the YAML
key (``--config``, ``planner sweep``) and the Python API's keyword, its
flag the command's option, its type and default the option's.

A field set to None means "the topology's default" (the help says which).
The command checks the values (planner.commands.replay); this module only
says what the knobs are.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from planner.domain.offload import OFFLOAD_BACKEND_NAMES
from planner.domain.rotation import RotationParams
from planner.replay.cfs_paging import DEFAULT_PEER_KV_GB
from planner.replay.cfs_scheduler import DEFAULT_RESCHEDULE_EVERY
from planner.replay.cluster_setup import DEFAULT_INSTANCES, DEFAULT_LINK_GBPS, ClusterKnobs
from planner.replay.longctx_setup import REPLAY_OFFLOAD_PARAMS
from planner.replay.policy_registries import CLUSTER, LONG_CONTEXT, ROTATION, SERVERLESS
from planner.replay.serverless_setup import (
    DEFAULT_MIG,
    DEFAULT_SWITCH_SETUP_S,
    LOAD_LINKS,
    MAX_DRAIN_S,
    MIN_HOLD_TTFT,
    STARVE_AFTER_S,
    URGENT_SLACK_TTFT,
    VICTIM_SLACK_MARGIN_S,
    ServerlessKnobs,
)

# Option groups of `planner replay --help`: (title, description).
ENGINE_LIMITS = (
    f"the engine's own limits ({ROTATION} topology)",
    "what a real engine was started with, to replay it as it is (vLLM: --block-size, "
    "--num-gpu-blocks-override, the swap connector's num_cpu_blocks)",
)
CFS = (
    "cfs policies (AQUA)",
    "cfs pages KV to host DRAM over the engine's PCIe link (the --cpu-kv-gb pool); "
    "cfs-peer pages it to memory a peer GPU lends over NVLink",
)
LONG_CONTEXT_GROUP = (f"{LONG_CONTEXT} topology", None)
CLUSTER_GROUP = (f"{CLUSTER} topology", None)
SERVERLESS_GROUP = (f"{SERVERLESS} topology", None)


def knob(
    default: Any,
    help: str,
    *,
    group: tuple[str, str | None] | None = None,
    metavar: str | None = None,
    choices: tuple[str, ...] | None = None,
) -> Any:
    """A dataclass field that is a knob (typed Any so that a default fits
    the field's own annotation)."""
    return field(
        default=default,
        metadata={"help": help, "group": group, "metavar": metavar, "choices": choices},
    )


_ROTATION_DEFAULTS = RotationParams()


@dataclass(frozen=True)
class SharedSettings:
    """Knobs every topology reads (or names where it does not apply)."""

    slo_ttft: float = knob(5.0, "TTFT SLO, s (default 5)")
    slo_tbt: float = knob(0.1, "TBT SLO, s (default 0.1)")
    max_batched_tokens: int = knob(
        2048, "chunked-prefill token budget per iteration (default 2048)"
    )
    max_running: int | None = knob(
        None,
        f"running requests at most (default 256; {LONG_CONTEXT}: the decode batch size, "
        "default 8, paused requests included)",
    )
    cpu_kv_gb: float | None = knob(None, "CPU memory for swapped KV, GB (default 90%% of host)")
    compute_jitter: float = knob(
        0.0,
        "multiply each iteration's modelled time by seeded lognormal noise with mean 1 "
        "and this coefficient of variation (default 0: the model exactly)",
        metavar="CV",
    )
    seed: int = knob(
        0,
        "seed of every random draw of a run (--compute-jitter); the same seed gives the "
        "same numbers (default 0)",
    )
    gpu_kv_gb: float | None = knob(
        None,
        "GPU memory for KV, GB (default: what the profile leaves at 90%% utilization); "
        f"with --topology {CLUSTER}: each instance's KV region",
        group=LONG_CONTEXT_GROUP,
    )


@dataclass(frozen=True)
class RotationSettings:
    """The rotation topology: the scheduler's knobs (LVF, CFS) and the
    engine's own limits."""

    alpha: float = knob(3.0, "LVF: rotary weight (default 3)")
    beta_tbt: float = knob(0.0, "LVF (default 0)")
    beta_ttft: float = knob(0.5, "LVF (default 0.5)")
    transfer_budget_blocks: int | None = knob(
        None,
        "LVF: blocks the link may move per iteration, every copy charged (lvf-paper: "
        "B_xfer, the blocks preemption may free); default: the link curve at the block size "
        "x the previous iteration's compute time",
    )
    preempt_slack_tbts: float = knob(
        _ROTATION_DEFAULTS.preempt_slack_tbts,
        "lvf: a running request may be preempted only with this much TPOT slack, in "
        f"TBT SLOs (default {_ROTATION_DEFAULTS.preempt_slack_tbts:g})",
    )
    resume_slack_tbts: float = knob(
        _ROTATION_DEFAULTS.resume_slack_tbts,
        "lvf: a rotary request may displace a running one once its TPOT slack is down "
        f"to this, in TBT SLOs (default {_ROTATION_DEFAULTS.resume_slack_tbts:g})",
    )
    lost_slack_tbts: float = knob(
        _ROTATION_DEFAULTS.lost_slack_tbts,
        "lvf: a request this far behind its TPOT SLO, in TBT SLOs, has lost it: it may "
        f"be preempted and displaces no one (default {_ROTATION_DEFAULTS.lost_slack_tbts:g}; "
        "negative: never lost)",
    )
    block_size: int = knob(16, "tokens per KV block (default 16)", group=ENGINE_LIMITS)
    gpu_kv_blocks: int | None = knob(
        None,
        "GPU KV blocks (default: what the profile's memory leaves at 90%% utilization)",
        group=ENGINE_LIMITS,
    )
    cpu_kv_blocks: int | None = knob(
        None, "CPU KV blocks for swapped KV (overrides --cpu-kv-gb)", group=ENGINE_LIMITS
    )
    prefix_cache: str = knob(
        "off",
        "automatic prefix caching over the trace's prefix_block_ids, as vLLM's: shared "
        "prompt blocks held once, cached tokens not prefilled, freed blocks evicted least "
        "recently used first (default off: every prompt is prefilled in full)",
        group=ENGINE_LIMITS,
        choices=("on", "off"),
    )
    prefix_block_tokens: int = knob(
        512,
        "prompt tokens each prefix_block_ids entry stands for (default 512, Mooncake's)",
        group=ENGINE_LIMITS,
    )
    admission_queue: str = knob(
        "on",
        "a measured profile's admission queue (its admission_s_per_request: per-request "
        "work the front end does one request at a time before the engine sees it) in "
        "front of the engine (default on; profiles without one have no queue)",
        group=ENGINE_LIMITS,
        choices=("on", "off"),
    )
    peer_kv_gb: float = knob(
        DEFAULT_PEER_KV_GB,
        f"cfs-peer: GPU memory the peer lends, GB (default {DEFAULT_PEER_KV_GB:g}; give "
        "it --cpu-kv-gb's size to compare the two links alone)",
        group=CFS,
    )
    cfs_every: int = knob(
        DEFAULT_RESCHEDULE_EVERY,
        "cfs, cfs-peer: re-partition the batch every K iterations or when a request "
        f"completes (default {DEFAULT_RESCHEDULE_EVERY})",
        group=CFS,
        metavar="K",
    )
    dram_copy_kib: float | None = knob(
        None,
        "cfs: page to DRAM in copies of this many KiB (vLLM swaps each layer's K and V "
        "of a block apart: 32 for llama-3-8b; default: one copy per block)",
        group=CFS,
    )


@dataclass(frozen=True)
class LongContextSettings:
    """The long-context offload topology (OrbitFlow and its baselines)."""

    slo_scale: float | None = knob(
        None,
        "TBT SLO = this x OrbitFlow's base latency (one decode step of --max-running "
        "requests filling the GPU KV memory, nothing offloaded); overrides --slo-tbt",
        group=LONG_CONTEXT_GROUP,
    )
    offload_time_limit: float | None = knob(
        None,
        "orbitflow: wall-clock limit of one plan's solves, s, a backstop behind the "
        f"node limit (default {REPLAY_OFFLOAD_PARAMS.time_limit_s:g})",
        group=LONG_CONTEXT_GROUP,
    )
    offload_node_limit: int | None = knob(
        None,
        "orbitflow: work limit of one plan's branch and bound, nodes; the same plans on "
        f"any machine (default {REPLAY_OFFLOAD_PARAMS.node_limit})",
        group=LONG_CONTEXT_GROUP,
    )
    offload_stagger: int | None = knob(
        None,
        "orbitflow: requests the search's stagger moves try per round (0: none, the "
        "search without stagger moves; default: the search's, 2)",
        group=LONG_CONTEXT_GROUP,
    )
    offload_spread: str = knob(
        "on",
        "orbitflow: the search's spread moves on large trees (default on; off: the "
        "search before them)",
        group=LONG_CONTEXT_GROUP,
        choices=("on", "off"),
    )
    offload_backend: str | None = knob(
        None,
        "orbitflow: the planner's solver (default "
        f"{REPLAY_OFFLOAD_PARAMS.backend}; see planner.domain.offload.OffloadParams)",
        group=LONG_CONTEXT_GROUP,
        choices=OFFLOAD_BACKEND_NAMES,
    )


@dataclass(frozen=True)
class ClusterSettings:
    """The cluster topology (KunServe buddy groups and baselines)."""

    instances: int | None = knob(
        None,
        f"serving instances, one full replica each (default {DEFAULT_INSTANCES})",
        group=CLUSTER_GROUP,
    )
    link_gbps: float | None = knob(
        None,
        "instance-to-instance bandwidth, GB/s: activations, KV exchange and migration "
        f"(default {DEFAULT_LINK_GBPS:g}, the paper's 200 Gbps RDMA)",
        group=CLUSTER_GROUP,
    )
    static_group_size: int | None = knob(
        None, "static-pp: instances per fixed pipeline group (default 2)", group=CLUSTER_GROUP
    )
    restore_hold: float | None = knob(
        None,
        "kunserve: seconds a group's demand must stay under the low watermark before "
        f"it restores (default {ClusterKnobs().restore.hold_s:g})",
        group=CLUSTER_GROUP,
    )


@dataclass(frozen=True)
class ServerlessSettings:
    """The serverless topology (C2CServe and baselines on MIG slices)."""

    mig: str | None = knob(
        None,
        "the GH200 MIG configuration: 1, 2, 3, 4 or 7 slices (C2CServe Table 1; "
        f"default {DEFAULT_MIG})",
        group=SERVERLESS_GROUP,
    )
    c2c_gbps: float | None = knob(
        None,
        "sustained host-to-device C2C bandwidth the slices share, GB/s (default 405)",
        group=SERVERLESS_GROUP,
    )
    load_link: str | None = knob(
        None,
        "dedicated, sllm, aegaeon: the link weights load over on a model switch "
        "(default: pcie at 55 GB/s for dedicated, c2c for sllm and aegaeon)",
        group=SERVERLESS_GROUP,
        choices=LOAD_LINKS,
    )
    models_per_slice: int | None = knob(
        None,
        "c2cserve: models resident on one slice at once, taking turns (default "
        f"{ServerlessKnobs().max_models_per_slice})",
        group=SERVERLESS_GROUP,
    )
    share_max_in_flight: int | None = knob(
        None,
        "c2cserve-light-share: a model joins a slice only while its residents' requests "
        "in flight and its own are at most this many, and a shared slice busier than that sheds a "
        f"resident (default {ServerlessKnobs().share_max_in_flight})",
        group=SERVERLESS_GROUP,
    )
    disk_gbps: float | None = knob(
        None,
        "read each model's weights from disk into host memory at this bandwidth, GB/s, "
        "the first time it is set up and after it left host memory (default: every model "
        "already in pinned host memory, the warm-switch setting)",
        group=SERVERLESS_GROUP,
    )
    host_memory_gb: float | None = knob(
        None,
        "with --disk-gbps: host memory holding model weights, GB (least recently used "
        f"models not on a slice leave it; default {ServerlessKnobs().host_memory_gb:g})",
        group=SERVERLESS_GROUP,
    )
    urgent_slack: float | None = knob(
        None,
        "policies that preempt: a waiting model may take a slice from an active one "
        "once its most urgent request has this much slack left, s (TTFT deadline - now, or "
        f"the pause its mean TPOT allows; default {URGENT_SLACK_TTFT:g} x the TTFT SLO)",
        group=SERVERLESS_GROUP,
    )
    min_hold: float | None = knob(
        None,
        "policies that preempt: a model keeps a slice at least this long once ready, s "
        f"(default {MIN_HOLD_TTFT:g} x the TTFT SLO)",
        group=SERVERLESS_GROUP,
    )
    victim_slack: float | None = knob(
        None,
        "policies that preempt: the slack every request of a preempted model needs, s "
        f"(default --starve-after + --min-hold + {VICTIM_SLACK_MARGIN_S:g})",
        group=SERVERLESS_GROUP,
    )
    max_drain: float | None = knob(
        None,
        "policies that preempt: a starving model drains its victim (no new requests) "
        f"for at most this long, then preempts the rest, s (default {MAX_DRAIN_S:g})",
        group=SERVERLESS_GROUP,
    )
    starve_after: float | None = knob(
        None,
        "policies that preempt: after this long waiting a model preempts whatever the "
        f"slack (the starvation backstop), s (default {STARVE_AFTER_S:g}: off)",
        group=SERVERLESS_GROUP,
    )
    switch_setup: float | None = knob(
        None,
        "c2cserve and the streaming baselines: engine setup on a model switch, s "
        f"(default {DEFAULT_SWITCH_SETUP_S:g})",
        group=SERVERLESS_GROUP,
    )


SETTINGS: tuple[type[Any], ...] = (
    SharedSettings,
    RotationSettings,
    LongContextSettings,
    ClusterSettings,
    ServerlessSettings,
)
Settings = (
    SharedSettings | RotationSettings | LongContextSettings | ClusterSettings | ServerlessSettings
)


@dataclass(frozen=True)
class Knob:
    """One knob: its name (YAML key, Python keyword), flag and value type."""

    name: str
    flag: str
    value_type: type[Any]
    optional: bool
    default: Any
    help: str
    group: tuple[str, str | None] | None
    metavar: str | None
    choices: tuple[str, ...] | None
    owner: type[Any]


def knobs() -> Iterator[Knob]:
    """Every knob of every settings class, in the order of --help."""
    for cls in SETTINGS:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            value_type, optional = _value_type(hints[f.name])
            yield Knob(
                name=f.name,
                flag="--" + f.name.replace("_", "-"),
                value_type=value_type,
                optional=optional,
                default=f.default,
                help=f.metadata["help"],
                group=f.metadata["group"],
                metavar=f.metadata["metavar"],
                choices=f.metadata["choices"],
                owner=cls,
            )


def knob_table() -> dict[str, Knob]:
    return {k.name: k for k in knobs()}


def _value_type(hint: Any) -> tuple[type[Any], bool]:
    """float | None -> (float, True); int -> (int, False)."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"a knob has one value type, got {hint}")
        return args[0], True
    if not isinstance(hint, type):
        raise TypeError(f"a knob has one value type, got {hint}")
    return hint, False


def add_knob_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds one option per knob, grouped as `planner replay --help` shows."""
    groups: dict[tuple[str, str | None], argparse._ArgumentGroup] = {}
    for k in knobs():
        target: argparse.ArgumentParser | argparse._ArgumentGroup = parser
        if k.group is not None:
            if k.group not in groups:
                groups[k.group] = parser.add_argument_group(*k.group)
            target = groups[k.group]
        options: dict[str, Any] = {"default": k.default, "help": k.help}
        if k.value_type is not str:
            options["type"] = k.value_type
        if k.metavar is not None:
            options["metavar"] = k.metavar
        if k.choices is not None:
            options["choices"] = k.choices
        target.add_argument(k.flag, **options)


def settings_values(settings: Settings) -> dict[str, Any]:
    """A settings object's knobs as name -> value."""
    return {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)}
