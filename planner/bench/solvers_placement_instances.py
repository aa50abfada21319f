"""Seeded instances of AQUA's placer for `planner bench solvers --problem
placement`: a cluster of GPUS GPUs (8 per server, 80 GB each) about 90% filled
with models of 1, 2 or 4 tensor-parallel shards, each a producer (spare
memory to lend) or a consumer (memory it needs) of 2 to 40 GB, in one of three
producer/consumer mixes."""

from __future__ import annotations

import random
from dataclasses import dataclass

from planner.domain.placement import PlacedModel, PlacementInputs

GB = 10**9
GPUS_PER_SERVER = 8
GPU_MEMORY_BYTES = 80 * GB
FILL = 0.9
# Mix name -> probability that a model is a producer.
MIXES = {"balanced": 0.5, "producer-heavy": 0.7, "consumer-heavy": 0.3}
SHARD_CHOICES = (1, 1, 1, 2, 2, 4)


@dataclass(frozen=True)
class PlacementInstance:
    gpus: int
    index: int
    seed: int
    mix: str
    inputs: PlacementInputs

    @property
    def models(self) -> int:
        return len(self.inputs.models)

    @property
    def servers(self) -> int:
        return self.inputs.num_servers


def make_instance(gpus: int, index: int, seed: int = 0) -> PlacementInstance:
    """Instance `index` of a size: the mixes in turn, its own random stream."""
    if gpus < GPUS_PER_SERVER or gpus % GPUS_PER_SERVER:
        raise ValueError(f"gpus must be a positive multiple of {GPUS_PER_SERVER}, got {gpus}")
    mix = list(MIXES)[index % len(MIXES)]
    rng = random.Random(f"placement/{seed}/{gpus}/{index}")
    models: list[PlacedModel] = []
    used = 0
    while used < gpus * FILL:
        shards = rng.choice(SHARD_CHOICES)
        if used + shards > gpus:
            break
        sign = 1 if rng.random() < MIXES[mix] else -1
        r = sign * rng.randint(2, 40) * GB
        models.append(PlacedModel(f"m{len(models)}", r, shards))
        used += shards
    inputs = PlacementInputs(
        tuple(models), gpus // GPUS_PER_SERVER, GPUS_PER_SERVER, GPU_MEMORY_BYTES
    )
    return PlacementInstance(gpus, index, seed, mix, inputs)
