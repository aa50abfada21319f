"""Iteration cost model: hand-computed constants, sanity against public
numbers, monotonicity, tensor parallelism, KV capacity."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.profiles import (
    HARDWARE_PROFILES,
    MODEL_PROFILES,
    HardwareProfile,
    IterationCostModel,
    ModelProfile,
    ProfileError,
)

LLAMA = MODEL_PROFILES["llama-3-8b"]
H100 = HARDWARE_PROFILES["h100-sxm-80gb"]
PAIRS = [(m, h) for m in sorted(MODEL_PROFILES) for h in sorted(HARDWARE_PROFILES)]


def test_llama_3_8b_on_h100_constants_by_hand():
    cost = IterationCostModel.derive(LLAMA, H100)
    c = cost.constants
    # Matmul weights: 8,030,261,248 parameters less the 128256 x 4096 input
    # embedding = 7,504,924,672; 2 FLOPs and 2 bytes each.
    flops = 2 * 7_504_924_672
    assert LLAMA.forward_flops_per_token() == flops == 15_009_849_344
    gemm = 989.4e12 * 0.65  # 643.11 TFLOP/s achievable
    hbm = 3350e9 * 0.8  # 2.68 TB/s achievable
    assert c.overhead_s == pytest.approx(200e-6 + 32 * 8e-6)  # 0.456 ms
    assert c.weights_floor_s == pytest.approx(15_009_849_344 / hbm)  # 5.601 ms
    assert c.weights_floor_s == pytest.approx(5.6007e-3, rel=1e-4)
    assert c.prefill_s_per_token == pytest.approx(flops / gemm)  # 23.34 us
    assert c.prefill_s_per_token == pytest.approx(23.339e-6, rel=1e-4)
    assert c.decode_s_per_token == c.prefill_s_per_token
    assert c.attn_s_per_context_token == pytest.approx(131_072 / hbm)  # 48.9 ns
    assert c.prefill_attn_s_per_pair == pytest.approx(4 * 32 * 128 * 32 / (989.4e12 * 0.5))
    assert cost.ridge_tokens() == pytest.approx(240.0, abs=0.1)


def test_sanity_llama_3_8b_decode_on_h100_is_6_to_8_ms():
    # Public single-stream numbers for Llama-3-8B bf16 on one H100 are ~6-7
    # ms per token (150-165 tokens/s). Lower bound: the 16 GB of weights at
    # the full 3.35 TB/s is 4.8 ms.
    cost = IterationCostModel.derive(LLAMA, H100)
    t = cost.decode_step_s(1, 1024)
    assert t > 16.06e9 / 3.35e12
    assert 6e-3 <= t <= 8e-3
    assert t == pytest.approx(0.456e-3 + 5.6007e-3 + 1024 * 48.907e-9, rel=1e-4)
    # A 2K prompt in one prefill: ~50 ms (compute-bound, ~40K tokens/s).
    assert 40e-3 <= cost.prefill_s(2048) <= 70e-3


def test_sanity_qwen_32b_on_gh200():
    qwen, gh200 = MODEL_PROFILES["qwen2.5-32b"], HARDWARE_PROFILES["gh200-144gb"]
    cost = IterationCostModel.derive(qwen, gh200)
    c = cost.constants
    hbm = 4900e9 * 0.8
    assert c.weights_floor_s == pytest.approx(2 * (32_763_876_352 - 152064 * 5120) / hbm)
    assert c.overhead_s == pytest.approx(200e-6 + 64 * 8e-6)
    # 65.5 GB of weights at 4.9 TB/s: 13.4 ms at full bandwidth, ~17 ms here.
    assert 15e-3 <= cost.decode_step_s(1, 1024) <= 20e-3
    assert cost.kv_blocks(16) == int((144e9 * 0.9 - 2 * 32_763_876_352) // 4_194_304) == 15_276


def test_iteration_time_formula():
    cost = IterationCostModel.derive(LLAMA, H100)
    c = cost.constants
    assert cost.iteration_time_s(0, 0, 0) == 0.0
    # Below the ridge: the weights floor.
    t = cost.iteration_time_s(0, 8, 8000)
    assert t == pytest.approx(c.overhead_s + c.weights_floor_s + 8000 * c.attn_s_per_context_token)
    # Above it: the GEMMs.
    t = cost.iteration_time_s(1000, 24, 5000, 7)
    expected = (
        c.overhead_s
        + 1000 * c.prefill_s_per_token
        + 24 * c.decode_s_per_token
        + 5000 * c.attn_s_per_context_token
        + 7 * c.prefill_attn_s_per_pair
    )
    assert t == pytest.approx(expected)
    with pytest.raises(ValueError, match="decode_tokens"):
        cost.iteration_time_s(0, -1, 0)


def test_prefill_attention_pairs():
    assert IterationCostModel.prefill_attention_pairs(4) == 4 + 3 + 2 + 1
    assert IterationCostModel.prefill_attention_pairs(2, 10) == 2 * 10 + 3


@pytest.mark.parametrize(("model", "hardware"), PAIRS)
def test_every_builtin_pair_derives(model, hardware):
    cost = IterationCostModel.derive(MODEL_PROFILES[model], HARDWARE_PROFILES[hardware])
    for name, value in cost.constants.as_dict().items():
        # The per-sequence term is measured only.
        assert value == 0 if name == "prefill_s_per_sequence" else value > 0, name
    assert cost.describe()["model"] == model


counts = st.integers(min_value=0, max_value=20_000)


@given(
    st.sampled_from(PAIRS),
    counts,
    counts,
    st.integers(min_value=0, max_value=2_000_000),
    st.sampled_from(["p", "d", "a", "q"]),
    st.integers(min_value=1, max_value=5000),
)
def test_monotone_in_every_input(pair, p, d, a, which, bump):
    cost = IterationCostModel.derive(MODEL_PROFILES[pair[0]], HARDWARE_PROFILES[pair[1]])
    base = [p, d, a, 0]
    more = list(base)
    more["pdaq".index(which)] += bump
    assert cost.iteration_time_s(*more) >= cost.iteration_time_s(*base)


def test_moe_floor_grows_with_the_experts_touched():
    cost = IterationCostModel.derive(MODEL_PROFILES["mixtral-8x7b"], H100)
    one, few, all_ = (cost.weights_floor_at_s(n) for n in (1, 4, 100_000))
    assert one < few < all_ == pytest.approx(cost.constants.weights_floor_s)
    # One token reads a quarter of the experts: ~12.7 of 46.6 B weights.
    assert one / all_ == pytest.approx(12_748_853_248 / 46_571_720_704)


def test_tensor_parallel():
    m70 = MODEL_PROFILES["llama-3-70b"]
    one = IterationCostModel.derive(m70, H100)
    four = IterationCostModel.derive(m70, H100, tensor_parallel=4)
    assert four.constants.weights_floor_s == pytest.approx(one.constants.weights_floor_s / 4)
    assert four.constants.overhead_s == pytest.approx(one.constants.overhead_s + 2 * 80 * 8e-6)
    allreduce = 2 * 80 * (2 * 3 / 4) * 8192 * 2 / (900e9 * 0.7)
    assert four.constants.decode_s_per_token == pytest.approx(
        one.constants.decode_s_per_token / 4 + allreduce
    )
    assert four.kv_bytes_per_token_per_gpu() == 327_680 // 4
    assert one.kv_blocks() == 0  # 141 GB of weights do not fit in 80 GB
    assert four.kv_blocks() == int((72e9 - four.weight_bytes_per_gpu()) // (16 * 81_920))
    # More ranks than KV heads: one head per rank, replicated.
    sixteen = IterationCostModel.derive(m70, H100, tensor_parallel=16)
    assert sixteen.kv_bytes_per_token_per_gpu() == 2 * 80 * 1 * 128 * 2
    for bad in (0, 3, -1):
        with pytest.raises(ProfileError) as err:
            IterationCostModel.derive(m70, H100, tensor_parallel=bad)
        assert err.value.field == "tensor_parallel"


def test_kv_capacity_by_hand():
    cost = IterationCostModel.derive(LLAMA, H100)
    # (80e9 x 0.9 - 16,060,522,496 B weights) / 2 MiB per 16-token block.
    assert cost.weight_bytes_per_gpu() == 16_060_522_496
    assert cost.kv_blocks() == (72_000_000_000 - 16_060_522_496) // 2_097_152 == 26_674
    assert cost.kv_blocks(32) == (72_000_000_000 - 16_060_522_496) // 4_194_304
    assert cost.kv_blocks(16, 0.5) == (40_000_000_000 - 16_060_522_496) // 2_097_152
    assert cost.kv_blocks(16, 0.9, reserve_bytes=2_097_152 * 10) == 26_664
    assert cost.kv_blocks(16, 0.1) == 0
    assert cost.cpu_kv_blocks(16) == int(250e9 * 0.9 // 2_097_152)
    for kwargs, field in (
        ({"block_size_tokens": 0}, "block_size_tokens"),
        ({"gpu_memory_utilization": 0.0}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"reserve_bytes": -1}, "reserve_bytes"),
    ):
        with pytest.raises(ProfileError) as err:
            cost.kv_blocks(**kwargs)
        assert err.value.field == field


def test_measured_constants_override():
    cost = IterationCostModel.derive(LLAMA, H100)
    measured = cost.with_constants({"overhead_s": 1e-3, "decode_s_per_token": 30e-6})
    assert measured.measured == {"overhead_s", "decode_s_per_token"}
    assert measured.constants.overhead_s == 1e-3
    assert measured.constants.prefill_s_per_token == cost.constants.prefill_s_per_token
    assert measured.iteration_time_s(0, 1, 0) > cost.iteration_time_s(0, 1, 0)
    with pytest.raises(ProfileError) as err:
        cost.with_constants({"bogus_s": 1.0})
    assert err.value.field == "bogus_s"
    with pytest.raises(ProfileError):
        cost.with_constants({"overhead_s": -1.0})


def test_missing_facts_name_the_field():
    bare_model = ModelProfile("custom", 4, 2, 64, 2, 1000)
    with pytest.raises(ProfileError) as err:
        IterationCostModel.derive(bare_model, H100)
    assert err.value.field == "model.hidden_size"
    bare_hw = HardwareProfile("half", 0, 20.0, 30.0, False)
    with pytest.raises(ProfileError) as err:
        IterationCostModel.derive(LLAMA, bare_hw)
    assert err.value.field == "hardware.peak_bf16_tflops"
