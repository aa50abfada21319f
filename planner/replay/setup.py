"""From a profile name (or a measured profile file) and knobs to everything a
replay run needs: the cost and link models, the engine's block pools and the
rotation policy's inputs."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from planner.domain.requests import Slo
from planner.domain.rotation import RotationInputs, RotationParams
from planner.profiles import (
    HardwareProfile,
    IterationCostModel,
    ModelProfile,
    find_hardware,
    find_model,
    load_profile,
)
from planner.profiles.errors import ProfileError
from planner.profiles.link import LinkModel
from planner.replay.engine import EngineConfig
from planner.trace.records import TraceRequest

DEFAULT_PROFILE = "llama-3-8b@h100-sxm-80gb"


@dataclass(frozen=True, slots=True)
class ReplayKnobs:
    slo: Slo = field(default_factory=Slo)
    rotation: RotationParams = field(default_factory=RotationParams)
    block_size_tokens: int = 16
    max_batched_tokens: int = 2048
    max_running: int = 256
    gpu_memory_utilization: float = 0.9
    # CPU memory set aside for KV (the paper gives 400 GB of its 480 GB);
    # None: 90% of the machine's host memory.
    cpu_kv_bytes: int | None = None
    tensor_parallel: int = 1
    # The engine's pools in blocks when it says them (vLLM's
    # --num-gpu-blocks-override, the connector's CPU blocks); None: derived
    # from the profile's memory (gpu_memory_utilization, cpu_kv_bytes).
    gpu_kv_blocks: int | None = None
    cpu_kv_blocks: int | None = None
    # Automatic prefix caching over the trace's prefix_block_ids (one id per
    # prefix_block_tokens tokens).
    prefix_cache: bool = False
    prefix_block_tokens: int = 512
    # Model a measured profile's admission queue (its admission_s_per_request)
    # in front of the engine; False: requests reach the engine as they come.
    admission_queue: bool = True


@dataclass(frozen=True, slots=True)
class ReplaySetup:
    profile: str
    model: ModelProfile
    hardware: HardwareProfile
    cost: IterationCostModel
    link: LinkModel
    engine: EngineConfig
    rotation: RotationInputs

    def describe(self) -> dict[str, object]:
        e = self.engine
        return {
            "profile": self.profile,
            "model": self.model.name,
            "hardware": self.hardware.name,
            "gpu_kv_blocks": e.gpu_kv_blocks,
            "cpu_kv_blocks": e.cpu_kv_blocks,
            "block_size_tokens": e.block_size_tokens,
            "block_bytes": e.block_bytes,
            "max_batched_tokens": e.max_batched_tokens,
            "max_running": e.max_running,
            "request_latency_s": e.request_latency_s,
            "admission_s_per_request": e.admission_s_per_request,
            "stream_s_per_token": e.stream_s_per_token,
            **({"stream_s_per_step": e.stream_s_per_step} if e.stream_s_per_step > 0 else {}),
            **(
                {"tokenize_s_per_prompt_token": e.tokenize_s_per_prompt_token}
                if e.tokenize_s_per_prompt_token > 0
                else {}
            ),
            **({"planning_s_per_call": e.planning_s_per_call} if e.planning_s_per_call > 0 else {}),
            "prefix_cache": e.prefix_cache,
            "prefix_block_tokens": e.prefix_block_tokens,
            "prefill_s_per_sequence": e.prefill_s_per_sequence,
            "slo_ttft_s": e.slo.ttft_s,
            "slo_tbt_s": e.slo.tbt_s,
            "alpha": self.rotation.params.alpha,
            "beta_tbt": self.rotation.params.beta_tbt,
            "beta_ttft": self.rotation.params.beta_ttft,
            "transfer_budget_blocks": self.rotation.params.transfer_budget_blocks,
        }


def build_setup(profile: str, knobs: ReplayKnobs) -> ReplaySetup:
    """profile: MODEL@HARDWARE with built-in names, or MODEL@FILE.json with a
    measured profile. Raises ProfileError naming what is wrong."""
    model_name, sep, hardware_name = profile.partition("@")
    request_latency_s = 0.0
    admission_s = 0.0
    stream_s = 0.0
    step_s = 0.0
    tokenize_s = 0.0
    planning_s = 0.0
    if not sep or not model_name or not hardware_name:
        raise ProfileError("profile", f"expected MODEL@HARDWARE, got {profile!r}")
    if hardware_name.endswith(".json") or Path(hardware_name).is_file():
        measured = load_profile(hardware_name)
        model = measured.find_model(model_name)
        if model is None:
            raise ProfileError("profile", f"unknown model {model_name!r}")
        hardware = measured.hardware
        cost = measured.cost_model(model, knobs.tensor_parallel)
        request_latency_s = measured.request_latency_s(model.name, knobs.tensor_parallel)
        planning_s = measured.extra_term("planning_s_per_call", model.name, knobs.tensor_parallel)
        if knobs.admission_queue:
            admission_s = measured.admission_s_per_request(model.name, knobs.tensor_parallel)
            stream_s = measured.stream_s_per_token(model.name, knobs.tensor_parallel)
            step_s = measured.stream_s_per_step(model.name, knobs.tensor_parallel)
            tokenize_s = measured.extra_term(
                "tokenize_s_per_prompt_token", model.name, knobs.tensor_parallel
            )
    else:
        found_model = find_model(model_name)
        found_hardware = find_hardware(hardware_name)
        if found_model is None:
            raise ProfileError("profile", f"unknown model {model_name!r}")
        if found_hardware is None:
            raise ProfileError("profile", f"unknown hardware {hardware_name!r}")
        model, hardware = found_model, found_hardware
        cost = IterationCostModel.derive(model, hardware, knobs.tensor_parallel)
    bs = knobs.block_size_tokens
    if knobs.gpu_kv_blocks is not None:
        gpu_blocks = knobs.gpu_kv_blocks
    else:
        gpu_blocks = cost.kv_blocks(bs, knobs.gpu_memory_utilization)
    if gpu_blocks <= 0:
        raise ProfileError(
            "profile", f"{model.name} does not fit on {hardware.name} with room for KV"
        )
    block_bytes = cost.block_bytes_per_gpu(bs)
    if knobs.cpu_kv_blocks is not None:
        cpu_blocks = knobs.cpu_kv_blocks
    elif knobs.cpu_kv_bytes is not None:
        cpu_blocks = knobs.cpu_kv_bytes // block_bytes
    else:
        cpu_blocks = cost.cpu_kv_blocks(bs)
    engine = EngineConfig(
        gpu_kv_blocks=gpu_blocks,
        cpu_kv_blocks=int(cpu_blocks),
        block_bytes=block_bytes,
        block_size_tokens=bs,
        max_batched_tokens=knobs.max_batched_tokens,
        max_running=knobs.max_running,
        slo=knobs.slo,
        request_latency_s=request_latency_s,
        admission_s_per_request=admission_s,
        stream_s_per_token=stream_s,
        stream_s_per_step=step_s,
        prefix_cache=knobs.prefix_cache,
        prefix_block_tokens=knobs.prefix_block_tokens,
        prefill_s_per_sequence=cost.constants.prefill_s_per_sequence,
        planning_s_per_call=planning_s,
        tokenize_s_per_prompt_token=tokenize_s,
    )
    return ReplaySetup(
        profile=profile,
        model=model,
        hardware=hardware,
        cost=cost,
        link=hardware.link_model(),
        engine=engine,
        rotation=RotationInputs(
            params=knobs.rotation, slo=knobs.slo, model=model, hardware=hardware
        ),
    )


def scale_rate(trace: list[TraceRequest], rate_scale: float) -> list[TraceRequest]:
    """The same requests arriving rate_scale times as fast."""
    if rate_scale == 1.0:
        return trace
    return [replace(t, arrival_s=t.arrival_s / rate_scale) for t in trace]
