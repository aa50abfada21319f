"""From a replay setup (profile, SLOs, batching knobs) and the cluster knobs
to a cluster run's config (cluster_engine)."""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.policies.buddy import RestoreConfig, TriggerConfig
from planner.replay.cluster_engine import ClusterConfig
from planner.replay.setup import ReplaySetup

# The paper's testbed network: 200 Gbps GPU-direct RDMA between instances.
DEFAULT_LINK_GBPS = 25.0
DEFAULT_INSTANCES = 8


@dataclass(frozen=True, slots=True)
class ClusterKnobs:
    instances: int = DEFAULT_INSTANCES
    # KV region of one instance, bytes; None: what the profile leaves.
    kv_bytes_per_instance: int | None = None
    link_gbps: float = DEFAULT_LINK_GBPS
    static_group_size: int = 2
    max_group_size: int = 8
    monitor_interval_s: float = 0.1
    # KV growth rates are smoothed (one arrival's prompt is a step, not a
    # rate): newest estimate weighted 0.2 at one tick per 0.1 s.
    trigger: TriggerConfig = field(default_factory=lambda: TriggerConfig(ewma_weight=0.2))
    restore: RestoreConfig = field(default_factory=RestoreConfig)
    jitter_cv: float = 0.0
    seed: int = 0


def cluster_config(setup: ReplaySetup, knobs: ClusterKnobs) -> ClusterConfig:
    """Raises ValueError when the knobs are inconsistent (no KV room, a
    static group larger than the cluster, ...)."""
    e = setup.engine
    blocks = e.gpu_kv_blocks
    if knobs.kv_bytes_per_instance is not None:
        blocks = int(knobs.kv_bytes_per_instance // e.block_bytes)
    if blocks <= 0:
        raise ValueError("an instance's KV region holds no block")
    return ClusterConfig(
        instances=knobs.instances,
        kv_blocks_per_instance=blocks,
        block_size=e.block_size_tokens,
        kv_bytes_per_token=e.block_bytes // e.block_size_tokens,
        param_bytes=setup.cost.weight_bytes_per_gpu(),
        num_layers=setup.model.num_layers,
        hidden_size=setup.model.hidden_size,
        link_gbps=knobs.link_gbps,
        reload_gbps=setup.hardware.h2d_gbps,
        max_batched_tokens=e.max_batched_tokens,
        max_running=e.max_running,
        slo=e.slo,
        static_group_size=knobs.static_group_size,
        max_group_size=knobs.max_group_size,
        monitor_interval_s=knobs.monitor_interval_s,
        trigger=knobs.trigger,
        restore=knobs.restore,
        jitter_cv=knobs.jitter_cv,
        seed=knobs.seed,
    )
