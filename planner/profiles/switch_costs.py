"""What a model switch costs the serverless systems C2CServe compares with
(paper §9.1 baselines, §9.2.3 / Fig. 11 warm-switch latencies), as replay
inputs.

A system that holds weights in HBM pays, on a switch, engine work (runtime
state, CUDA graphs, KV pool set-up: ``engine_init_s``) plus the weight bytes
over its load link, which concurrent loads share. The paper gives only the
total of a warm switch (weights already in pinned host memory) on GH200,
where host-to-device copies go over NVLink-C2C:

| system | dense | MoE |
|---|---|---|
| ServerlessLLM | 1.7 s | 12 s |
| Aegaeon | 119 ms | (dense only) |
| MoE-Infinity | (MoE only) | 105 s |
| FineMoE | (MoE only) | 128 s |
| C2CServe | 50 ms | 318 ms |

The text does not say which model the dense figures are for; we take them
as Llama-3-8B's (the middle of its 3B / 8B / 70B) and split each into engine
work = total - 16.06 GB / 405 GB/s (GH200's sustained C2C), so that the
replay's switch of that model over C2C, alone on the link, costs exactly the
paper's figure. C2CServe's 50 ms is engine set-up only: it moves no weights.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.profiles.errors import ProfileError
from planner.profiles.mig import GB, GH200_C2C_LINK
from planner.profiles.models import MODEL_PROFILES

# The model the paper's dense switch latencies are taken to be for.
REFERENCE_MODEL = "llama-3-8b"


@dataclass(frozen=True, slots=True)
class SwitchProfile:
    name: str
    # The system as the paper names it.
    system: str
    # The paper's warm-switch latency of the reference model, s.
    paper_switch_s: float
    # Weights live in HBM (loaded on a switch) or stream from host memory.
    weights_in_hbm: bool

    def engine_init_s(
        self,
        *,
        reference_weight_bytes: float | None = None,
        load_gbps: float = GH200_C2C_LINK.sustained_gbps,
    ) -> float:
        """The switch latency less the weight load it includes (none when
        the weights stream)."""
        if not load_gbps > 0:
            raise ProfileError("load_gbps", f"must be > 0, got {load_gbps}")
        if not self.weights_in_hbm:
            return self.paper_switch_s
        weights = (
            reference_weight_bytes
            if reference_weight_bytes is not None
            else float(MODEL_PROFILES[REFERENCE_MODEL].param_bytes)
        )
        init = self.paper_switch_s - weights / (load_gbps * GB)
        if init < 0:
            raise ProfileError(
                "paper_switch_s",
                f"{self.system}'s {self.paper_switch_s:g} s is less than loading "
                f"{weights / GB:.3g} GB at {load_gbps:g} GB/s",
            )
        return init


DENSE_SWITCH_PROFILES: dict[str, SwitchProfile] = {
    p.name: p
    for p in (
        SwitchProfile("sllm", "ServerlessLLM", 1.7, weights_in_hbm=True),
        SwitchProfile("aegaeon", "Aegaeon", 0.119, weights_in_hbm=True),
        SwitchProfile("c2cserve", "C2CServe", 0.05, weights_in_hbm=False),
    )
}
