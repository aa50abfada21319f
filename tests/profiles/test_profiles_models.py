"""Model profiles: architecture facts, parameter counts, KV geometry."""

from __future__ import annotations

import pytest

from planner.profiles import MODEL_PROFILES, ModelProfile, count_params, find_model

# (name, layers, kv heads, head dim) from each config.json; KV bytes per token
# = 2 (K and V) x layers x kv heads x head dim x 2 bytes (bf16).
KV_BY_HAND = {
    "llama-3-8b": (2 * 32 * 8 * 128 * 2, 131_072),
    "llama-3-70b": (2 * 80 * 8 * 128 * 2, 327_680),
    "llama-3.1-70b": (2 * 80 * 8 * 128 * 2, 327_680),
    "qwen2.5-14b": (2 * 48 * 8 * 128 * 2, 196_608),
    "qwen2.5-32b": (2 * 64 * 8 * 128 * 2, 262_144),
    "mixtral-8x7b": (2 * 32 * 8 * 128 * 2, 131_072),
}

# Counted by hand from config.json (see planner/profiles/models.py), and the
# total the model card / paper publishes.
PARAMS = {
    "llama-3-8b": (8_030_261_248, 8.03e9),
    "llama-3-70b": (70_553_706_496, 70.6e9),
    "llama-3.1-70b": (70_553_706_496, 70.6e9),
    "qwen2.5-14b": (14_770_033_664, 14.7e9),
    "qwen2.5-32b": (32_763_876_352, 32.5e9),
    "mixtral-8x7b": (46_702_792_704, 46.7e9),
}


def test_the_papers_models_are_built_in():
    for name in ("llama-3-8b", "llama-3.1-70b", "llama-3-70b", "qwen2.5-14b", "qwen2.5-32b"):
        assert name in MODEL_PROFILES
    assert "mixtral-8x7b" in MODEL_PROFILES


@pytest.mark.parametrize("name", sorted(KV_BY_HAND))
def test_kv_bytes_per_token_and_block_bytes_by_hand(name):
    m = MODEL_PROFILES[name]
    formula, value = KV_BY_HAND[name]
    assert m.kv_bytes_per_token() == formula == value
    assert m.block_bytes(16) == 16 * value
    assert m.block_bytes(32) == 32 * value


def test_qwen_32b_segment_and_block_match_the_paper():
    # SuperInfer §4.3.1: N_L = 64, 16-token blocks: 64 KB per layer, 4 MB in all.
    m = MODEL_PROFILES["qwen2.5-32b"]
    assert m.segment_bytes(16) == 64 * 1024
    assert m.block_bytes(16) == 4 * 1024 * 1024


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_parameter_counts_by_hand_and_near_the_published_totals(name):
    m = MODEL_PROFILES[name]
    exact, published = PARAMS[name]
    assert m.param_count() == exact
    assert m.param_bytes == 2 * exact
    assert abs(exact - published) / published < 0.01


def test_llama_3_8b_count_term_by_term():
    attention = 4096 * 4096 + 2 * 4096 * 1024 + 4096 * 4096
    mlp = 3 * 4096 * 14336
    layer = attention + mlp + 2 * 4096
    total = 32 * layer + 2 * 128256 * 4096 + 4096
    assert total == 8_030_261_248 == MODEL_PROFILES["llama-3-8b"].param_count()


def test_head_dim_is_hidden_over_heads():
    for m in MODEL_PROFILES.values():
        assert m.head_dim == m.hidden_size // m.num_attention_heads == 128


def test_mixtral_active_parameters_differ_from_total():
    m = MODEL_PROFILES["mixtral-8x7b"]
    assert m.is_moe and (m.num_experts, m.experts_per_token) == (8, 2)
    assert m.active_param_count() == 12_879_925_248  # "12.9B active" (Mixtral paper)
    assert m.param_count() == 46_702_792_704
    # FLOPs follow the active parameters, less the embedding lookup.
    assert m.forward_flops_per_token() == 2 * (12_879_925_248 - 32000 * 4096)


def test_dense_active_equals_total():
    for name in ("llama-3-8b", "qwen2.5-32b"):
        m = MODEL_PROFILES[name]
        assert m.active_param_count() == m.param_count()


def test_qwen_has_qkv_bias_llama_does_not():
    assert MODEL_PROFILES["qwen2.5-32b"].qkv_bias
    assert not MODEL_PROFILES["llama-3-8b"].qkv_bias
    with_bias = count_params(
        num_layers=1,
        hidden_size=8,
        intermediate_size=16,
        num_attention_heads=2,
        num_kv_heads=1,
        head_dim=4,
        vocab_size=10,
        qkv_bias=True,
    )
    without = count_params(
        num_layers=1,
        hidden_size=8,
        intermediate_size=16,
        num_attention_heads=2,
        num_kv_heads=1,
        head_dim=4,
        vocab_size=10,
    )
    assert with_bias - without == 8 + 2 * 4


def test_weights_read_bytes_dense_and_moe():
    llama = MODEL_PROFILES["llama-3-8b"]
    assert llama.weights_read_bytes(0) == 0
    assert llama.weights_read_bytes(1) == llama.weights_read_bytes(4096) == 2 * 7_504_924_672
    mix = MODEL_PROFILES["mixtral-8x7b"]
    # One token touches its 2 experts per layer: the active weights.
    one = mix.weights_read_bytes(1)
    assert one == pytest.approx(2 * (mix.active_param_count() - 32000 * 4096))
    many = mix.weights_read_bytes(10_000)
    assert many == pytest.approx(2 * (mix.param_count() - 32000 * 4096))
    assert one < mix.weights_read_bytes(2) < mix.weights_read_bytes(8) < many


def test_aliases_and_lookup():
    assert find_model("LLAMA-3-8B") is MODEL_PROFILES["llama-3-8b"]
    assert find_model("llama-3.1-8b") is MODEL_PROFILES["llama-3-8b"]
    assert find_model("mixtral-8x7b-v0.1") is MODEL_PROFILES["mixtral-8x7b"]
    assert find_model("gpt-2") is None
    # Llama-3 and 3.1 70B share their shape.
    a, b = MODEL_PROFILES["llama-3-70b"], MODEL_PROFILES["llama-3.1-70b"]
    assert a.param_count() == b.param_count() and a.kv_bytes_per_token() == b.kv_bytes_per_token()


def test_every_builtin_names_its_source():
    for m in MODEL_PROFILES.values():
        assert "config.json" in m.source


def test_legacy_positional_constructor_still_works():
    m = ModelProfile("custom", 4, 2, 64, 2, 1000)
    assert m.kv_bytes_per_token() == 2 * 4 * 2 * 64 * 2
    assert m.block_bytes(16) == 16 * m.kv_bytes_per_token()
    assert not m.has_architecture
    assert m.param_count() == 500
