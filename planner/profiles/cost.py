"""Iteration cost model: how long one engine iteration computes, and how many
KV blocks fit on the GPU.

For a (model, hardware, tensor_parallel) triple the time of an iteration that
runs ``P`` prefill tokens and ``D`` decode tokens, whose attention reads ``A``
context tokens of KV in all, is an affine form with a weights-read floor::

    t = c0 + max(W(P + D), c_prefill * P + c_decode * D) + c_attn * A + c_pair * Q

- ``c0`` ``overhead_s`` — fixed per iteration: scheduling, sampling and the
  host round trip (200 µs) plus kernel launches and small-kernel tails (8 µs
  per layer), plus under tensor parallelism two all-reduce latencies per
  layer (8 µs each). These are estimates, not derived from FLOPs or bytes; a
  measured profile replaces them.
- ``W`` ``weights_floor_s`` — reading every weight the iteration uses once
  from HBM: ``weight bytes / (hbm_gbps * hbm_efficiency)``. Decode at small
  batch is bound by this, not by FLOPs. MoE: only the experts the tokens
  touch are read (``ModelProfile.weights_read_bytes``); the constant shown is
  the all-experts value.
- ``c_prefill``, ``c_decode`` — per token, the linear layers' FLOPs
  (``2 * active matmul parameters``) over the achievable tensor rate
  ``peak_bf16_tflops * gemm_efficiency``, plus under tensor parallelism the
  token's share of two all-reduces per layer over NVLink (70% bus
  efficiency). Derived equal; a measured profile may set them apart.
- ``c_attn`` ``attn_s_per_context_token`` — reading one context token's KV
  (all layers) from HBM: ``kv_bytes_per_token / (hbm_gbps * hbm_efficiency)``.
  ``A`` is the sum over the batch's sequences of the tokens each one's
  attention reads (its context length, this iteration's tokens included).
- ``c_pair`` ``prefill_attn_s_per_pair`` — the compute of one (query, key)
  pair of prefill attention, ``4 * heads * head_dim * layers`` FLOPs over
  ``peak_bf16_tflops * attention_efficiency``. ``Q`` (optional, default 0) is
  the number of such pairs (:meth:`IterationCostModel.prefill_attention_pairs`);
  it matters for long prompts only (Llama-3-8B: 3% of a 2K prompt's FLOPs).
- ``c_seq`` ``prefill_s_per_sequence`` — per sequence that takes a prefill
  chunk in the iteration (a request admitted, or readmitted after a
  preemption): its setup in the engine (scheduling, input preparation,
  sampling state). Not derived (0); a measured profile fits it. The
  single-engine replay charges it (``EngineConfig.prefill_s_per_sequence``,
  from this constant), once per prefilling sequence of each iteration.

The max() is the roofline: below ``ridge_tokens = W / c_decode`` tokens the
iteration streams the weights (memory-bound), above it the GEMMs are
compute-bound. Every term is non-decreasing in every input.

Sanity check (tests/profiles): Llama-3-8B on H100 SXM, one decode token at
1K context: 15.01 GB of matmul weights / (3.35 TB/s * 0.8) = 5.60 ms, + 0.46 ms
overhead + 0.05 ms of KV ≈ 6.1 ms, matching the ~6-7 ms per token public
single-stream numbers for vLLM / TensorRT-LLM (150-165 tokens/s). A 2048-token
prefill: 2048 * 23.3 µs + attention ≈ 49 ms.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from planner.profiles.errors import ProfileError
from planner.profiles.hardware import HardwareProfile
from planner.profiles.models import ModelProfile

BASE_OVERHEAD_S = 200e-6
PER_LAYER_OVERHEAD_S = 8e-6
ALLREDUCE_LATENCY_S = 8e-6
ALLREDUCE_BUS_EFFICIENCY = 0.7
ACTIVATION_BYTES = 2

DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
DEFAULT_BLOCK_SIZE_TOKENS = 16


@dataclass(frozen=True, slots=True)
class CostConstants:
    """The constants of the iteration cost model (seconds; see the module
    docstring)."""

    overhead_s: float
    weights_floor_s: float
    prefill_s_per_token: float
    decode_s_per_token: float
    attn_s_per_context_token: float
    prefill_attn_s_per_pair: float
    prefill_s_per_sequence: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {f.name: float(getattr(self, f.name)) for f in fields(self)}


COST_CONSTANT_NAMES: tuple[str, ...] = tuple(f.name for f in fields(CostConstants))


def _check_tp(model: ModelProfile, tp: int) -> None:
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ProfileError("tensor_parallel", f"must be an integer >= 1, got {tp!r}")
    heads = model.num_attention_heads
    if heads and heads % tp:
        raise ProfileError(
            "tensor_parallel", f"{tp} does not divide {model.name}'s {heads} attention heads"
        )
    kv = model.num_kv_heads
    if kv % tp and tp % kv:
        raise ProfileError(
            "tensor_parallel",
            f"{tp} neither divides nor is a multiple of {model.name}'s {kv} KV heads",
        )


@dataclass(frozen=True, slots=True)
class IterationCostModel:
    """Iteration time and KV capacity of one model on one machine.

    Build with :meth:`derive` (constants from the profiles' FLOPs, bytes and
    peak rates); :meth:`with_constants` overrides some or all of them with
    measured values (``measured`` names those).
    """

    model: ModelProfile
    hardware: HardwareProfile
    tensor_parallel: int
    constants: CostConstants
    measured: frozenset[str] = frozenset()

    # --- Construction -------------------------------------------------------------

    @staticmethod
    def derive(
        model: ModelProfile, hardware: HardwareProfile, tensor_parallel: int = 1
    ) -> IterationCostModel:
        tp = tensor_parallel
        _check_tp(model, tp)
        model.require_architecture()
        if not hardware.peak_bf16_tflops > 0:
            raise ProfileError(
                "hardware.peak_bf16_tflops",
                f"{hardware.name!r} does not give it; the cost model needs it",
            )
        if not hardware.hbm_gbps > 0:
            raise ProfileError(
                "hardware.hbm_gbps", f"{hardware.name!r} does not give it; the cost model needs it"
            )
        if tp > 1 and not hardware.nvlink_gbps > 0:
            raise ProfileError(
                "hardware.nvlink_gbps", f"{hardware.name!r} does not give it; tensor_parallel > 1"
            )
        gemm_flops = hardware.peak_bf16_tflops * 1e12 * hardware.gemm_efficiency
        attn_flops = hardware.peak_bf16_tflops * 1e12 * hardware.attention_efficiency
        hbm = hardware.hbm_gbps * 1e9 * hardware.hbm_efficiency
        layers = model.num_layers

        overhead = BASE_OVERHEAD_S + layers * PER_LAYER_OVERHEAD_S
        per_token = model.forward_flops_per_token() / tp / gemm_flops
        if tp > 1:
            overhead += 2 * layers * ALLREDUCE_LATENCY_S
            ring = 2 * (tp - 1) / tp
            allreduce_bytes = 2 * layers * ring * model.hidden_size * ACTIVATION_BYTES
            per_token += allreduce_bytes / (hardware.nvlink_gbps * 1e9 * ALLREDUCE_BUS_EFFICIENCY)
        full_weights = model.weights_read_bytes(_ALL_TOKENS) / tp
        constants = CostConstants(
            overhead_s=overhead,
            weights_floor_s=full_weights / hbm,
            prefill_s_per_token=per_token,
            decode_s_per_token=per_token,
            attn_s_per_context_token=_kv_bytes_per_token(model, tp) / hbm,
            prefill_attn_s_per_pair=model.attention_flops_per_pair() / tp / attn_flops,
        )
        return IterationCostModel(model, hardware, tp, constants)

    def with_constants(self, values: Mapping[str, float]) -> IterationCostModel:
        """These constants replaced (measured), the others kept."""
        for name, value in values.items():
            if name not in COST_CONSTANT_NAMES:
                known = ", ".join(COST_CONSTANT_NAMES)
                raise ProfileError(name, f"not a cost-model constant (known: {known})")
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ProfileError(name, f"must be a finite number >= 0, got {value!r}")
        constants = replace(self.constants, **{k: float(v) for k, v in values.items()})
        return replace(self, constants=constants, measured=self.measured | frozenset(values))

    # --- Iteration time -----------------------------------------------------------

    def weights_floor_at_s(self, tokens: int) -> float:
        """W(tokens): seconds to read the weights an iteration of ``tokens``
        tokens uses (all of them for a dense model, the touched experts for
        MoE)."""
        if tokens <= 0:
            return 0.0
        floor = self.constants.weights_floor_s
        if not self.model.is_moe:
            return floor
        return (
            floor
            * self.model.weights_read_bytes(tokens)
            / self.model.weights_read_bytes(_ALL_TOKENS)
        )

    def iteration_time_s(
        self,
        prefill_tokens: int,
        decode_tokens: int,
        attended_context_tokens: int,
        prefill_attention_pairs: int = 0,
    ) -> float:
        """Seconds one iteration computes (0 for an empty one)."""
        for name, value in (
            ("prefill_tokens", prefill_tokens),
            ("decode_tokens", decode_tokens),
            ("attended_context_tokens", attended_context_tokens),
            ("prefill_attention_pairs", prefill_attention_pairs),
        ):
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        tokens = prefill_tokens + decode_tokens
        if tokens == 0 and attended_context_tokens == 0 and prefill_attention_pairs == 0:
            return 0.0
        c = self.constants
        linear = c.prefill_s_per_token * prefill_tokens + c.decode_s_per_token * decode_tokens
        return (
            c.overhead_s
            + max(self.weights_floor_at_s(tokens), linear)
            + c.attn_s_per_context_token * attended_context_tokens
            + c.prefill_attn_s_per_pair * prefill_attention_pairs
        )

    @staticmethod
    def prefill_attention_pairs(chunk_tokens: int, prior_context_tokens: int = 0) -> int:
        """Causal (query, key) pairs of a prefill chunk after
        ``prior_context_tokens`` already cached: every chunk token sees the
        prior context and the chunk up to itself."""
        n = chunk_tokens
        return n * prior_context_tokens + n * (n + 1) // 2

    def decode_step_s(self, batch_size: int, context_tokens: int) -> float:
        """One decode iteration of ``batch_size`` sequences of
        ``context_tokens`` tokens each."""
        return self.iteration_time_s(0, batch_size, batch_size * context_tokens)

    def prefill_s(self, prompt_tokens: int) -> float:
        """One iteration that prefills one whole prompt."""
        pairs = self.prefill_attention_pairs(prompt_tokens)
        return self.iteration_time_s(prompt_tokens, 0, prompt_tokens, pairs)

    def ridge_tokens(self) -> float:
        """Tokens per iteration above which decode is compute-bound."""
        return self.constants.weights_floor_s / self.constants.decode_s_per_token

    # --- Memory -------------------------------------------------------------------

    def weight_bytes_per_gpu(self) -> int:
        """Weights each GPU holds (param_bytes / tensor_parallel)."""
        total = self.model.param_bytes or self.model.param_count() * self.model.weight_dtype_bytes
        return math.ceil(total / self.tensor_parallel)

    def kv_bytes_per_token_per_gpu(self) -> int:
        return _kv_bytes_per_token(self.model, self.tensor_parallel)

    def block_bytes_per_gpu(self, block_size_tokens: int = DEFAULT_BLOCK_SIZE_TOKENS) -> int:
        return self.kv_bytes_per_token_per_gpu() * block_size_tokens

    def kv_blocks(
        self,
        block_size_tokens: int = DEFAULT_BLOCK_SIZE_TOKENS,
        gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
        reserve_bytes: int = 0,
    ) -> int:
        """GPU KV blocks: ``(hbm_bytes * utilization - weights - reserve) /
        block bytes``, per GPU (vLLM's rule; ``reserve_bytes`` stands for the
        activation peak vLLM profiles, 0 by default), at least 0."""
        if block_size_tokens <= 0:
            raise ProfileError("block_size_tokens", f"must be > 0, got {block_size_tokens}")
        if not 0 < gpu_memory_utilization <= 1:
            raise ProfileError(
                "gpu_memory_utilization", f"must be in (0, 1], got {gpu_memory_utilization}"
            )
        if reserve_bytes < 0:
            raise ProfileError("reserve_bytes", f"must be >= 0, got {reserve_bytes}")
        budget = self.hardware.hbm_bytes * gpu_memory_utilization
        free = budget - self.weight_bytes_per_gpu() - reserve_bytes
        if free <= 0:
            return 0
        return int(free // self.block_bytes_per_gpu(block_size_tokens))

    def cpu_kv_blocks(
        self,
        block_size_tokens: int = DEFAULT_BLOCK_SIZE_TOKENS,
        host_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    ) -> int:
        """KV blocks of host memory per GPU (swap space), at the given share
        of ``host_memory_bytes``."""
        if block_size_tokens <= 0:
            raise ProfileError("block_size_tokens", f"must be > 0, got {block_size_tokens}")
        if not 0 < host_memory_utilization <= 1:
            raise ProfileError(
                "host_memory_utilization", f"must be in (0, 1], got {host_memory_utilization}"
            )
        room = self.hardware.host_memory_bytes * host_memory_utilization
        return int(room // self.block_bytes_per_gpu(block_size_tokens))

    # --- Reporting ----------------------------------------------------------------

    def describe(
        self,
        block_size_tokens: int = DEFAULT_BLOCK_SIZE_TOKENS,
        gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    ) -> dict[str, Any]:
        """The constants, their inputs and a few worked numbers, for
        ``planner profiles show MODEL@HARDWARE`` and its ``--json``."""
        hw = self.hardware
        blocks = self.kv_blocks(block_size_tokens, gpu_memory_utilization)
        return {
            "model": self.model.name,
            "hardware": hw.name,
            "tensor_parallel": self.tensor_parallel,
            "constants": self.constants.as_dict(),
            "measured_constants": sorted(self.measured),
            "inputs": {
                "forward_flops_per_token": self.model.forward_flops_per_token(),
                "attention_flops_per_pair": self.model.attention_flops_per_pair(),
                "weights_read_bytes": self.model.weights_read_bytes(_ALL_TOKENS),
                "kv_bytes_per_token_per_gpu": self.kv_bytes_per_token_per_gpu(),
                "achievable_gemm_tflops": hw.peak_bf16_tflops * hw.gemm_efficiency,
                "achievable_attention_tflops": hw.peak_bf16_tflops * hw.attention_efficiency,
                "achievable_hbm_gbps": hw.hbm_gbps * hw.hbm_efficiency,
            },
            "ridge_tokens": self.ridge_tokens(),
            "examples_s": {
                "decode_batch1_ctx1024": self.decode_step_s(1, 1024),
                "decode_batch64_ctx1024": self.decode_step_s(64, 1024),
                "decode_batch256_ctx1024": self.decode_step_s(256, 1024),
                "prefill_2048": self.prefill_s(2048),
            },
            "kv_capacity": {
                "block_size_tokens": block_size_tokens,
                "gpu_memory_utilization": gpu_memory_utilization,
                "weight_bytes_per_gpu": self.weight_bytes_per_gpu(),
                "block_bytes_per_gpu": self.block_bytes_per_gpu(block_size_tokens),
                "gpu_blocks": blocks,
                "gpu_tokens": blocks * block_size_tokens,
                "cpu_blocks": self.cpu_kv_blocks(block_size_tokens),
            },
        }


# Tokens enough for every expert to be touched (weights_read_bytes -> all).
_ALL_TOKENS = 1 << 30


def _kv_bytes_per_token(model: ModelProfile, tp: int) -> int:
    """KV bytes per token on one GPU: KV heads split over the TP ranks, or
    replicated one per rank when there are more ranks than heads."""
    heads = max(1, model.num_kv_heads // tp)
    return 2 * model.num_layers * heads * model.head_dim * model.kv_dtype_bytes
