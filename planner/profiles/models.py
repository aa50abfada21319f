"""Model profiles: the architecture facts the planner and the cost model need.

Every built-in number is copied from the model's published Hugging Face
``config.json`` (named in each entry's ``source``); parameter counts are not
typed in but counted from the architecture by :func:`count_params` and checked
in the tests against the totals the model cards publish (8.03B, 70.6B, 14.7B,
32.8B, 46.7B total / 12.9B active). Weights and KV cache are bf16 (2 bytes).

Counting (standard decoder, SwiGLU MLP, RMSNorm):

- attention per layer: q ``hidden x heads*head_dim``, k and v
  ``hidden x kv_heads*head_dim`` each, o ``heads*head_dim x hidden``, plus the
  q/k/v biases when ``qkv_bias`` (Qwen2.5);
- MLP per expert: gate, up and down, ``3 x hidden x intermediate``;
- router (MoE only): ``hidden x num_experts``; two norms per layer of
  ``hidden``;
- input embedding ``vocab x hidden``; LM head ``vocab x hidden`` unless tied;
  final norm ``hidden``.

Active parameters per token count ``experts_per_token`` experts instead of
``num_experts`` (Mixtral: top-2 of 8).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.profiles.errors import ProfileError

GB = 1e9
GIB = 1024**3


def count_params(
    *,
    num_layers: int,
    hidden_size: int,
    intermediate_size: int,
    num_attention_heads: int,
    num_kv_heads: int,
    head_dim: int,
    vocab_size: int,
    num_experts: int = 1,
    experts_counted: int | None = None,
    qkv_bias: bool = False,
    tie_word_embeddings: bool = False,
) -> int:
    """Parameters of a decoder-only transformer (see the module docstring).

    ``experts_counted`` experts' MLPs are counted per layer (default all of
    them: the total; pass ``experts_per_token`` for the active count).
    """
    experts = num_experts if experts_counted is None else experts_counted
    q = num_attention_heads * head_dim
    kv = num_kv_heads * head_dim
    attention = hidden_size * q + 2 * hidden_size * kv + q * hidden_size
    if qkv_bias:
        attention += q + 2 * kv
    mlp = experts * 3 * hidden_size * intermediate_size
    router = hidden_size * num_experts if num_experts > 1 else 0
    norms = 2 * hidden_size
    per_layer = attention + mlp + router + norms
    embeddings = vocab_size * hidden_size * (1 if tie_word_embeddings else 2)
    return num_layers * per_layer + embeddings + hidden_size


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """A model's shape. The first six fields are what the rotation policy and
    the proto carry (KV geometry and parameter bytes); the rest (defaults 0 =
    unknown) describe the architecture for the cost model.

    ``param_bytes`` is the weights' size in memory; for built-ins it is
    ``count_params(...) * weight_dtype_bytes``.
    """

    name: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    kv_dtype_bytes: int = 2
    param_bytes: int = 0
    hidden_size: int = 0
    intermediate_size: int = 0
    num_attention_heads: int = 0
    vocab_size: int = 0
    num_experts: int = 1
    experts_per_token: int = 1
    qkv_bias: bool = False
    tie_word_embeddings: bool = False
    weight_dtype_bytes: int = 2
    source: str = ""

    # --- KV cache (used by the rotation policy) -----------------------------------

    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_dtype_bytes

    def block_bytes(self, block_size_tokens: int) -> int:
        """One KV block across all layers: one contiguous region in a
        block-first layout."""
        return self.kv_bytes_per_token() * block_size_tokens

    def segment_bytes(self, block_size_tokens: int) -> int:
        """One KV block of one layer (K and V): the contiguous unit of a
        layer-first layout (SuperInfer §4.3.1: 64 KB for Qwen2.5-32B)."""
        return self.block_bytes(block_size_tokens) // self.num_layers

    # --- Architecture -------------------------------------------------------------

    @property
    def has_architecture(self) -> bool:
        """Whether the fields the cost model needs are known."""
        return (
            self.hidden_size > 0
            and self.intermediate_size > 0
            and self.num_attention_heads > 0
            and self.vocab_size > 0
        )

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    def require_architecture(self) -> None:
        for name in ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size"):
            if getattr(self, name) <= 0:
                raise ProfileError(
                    f"model.{name}", f"{self.name!r} does not give it; the cost model needs it"
                )

    def _count(self, experts_counted: int | None) -> int:
        return count_params(
            num_layers=self.num_layers,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_attention_heads=self.num_attention_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            vocab_size=self.vocab_size,
            num_experts=self.num_experts,
            experts_counted=experts_counted,
            qkv_bias=self.qkv_bias,
            tie_word_embeddings=self.tie_word_embeddings,
        )

    def param_count(self) -> int:
        """All parameters: counted from the architecture when it is known,
        else ``param_bytes / weight_dtype_bytes``."""
        if self.has_architecture:
            return self._count(None)
        return self.param_bytes // self.weight_dtype_bytes

    def active_param_count(self) -> int:
        """Parameters one token goes through (MoE: ``experts_per_token`` of
        the experts)."""
        if self.has_architecture:
            return self._count(self.experts_per_token)
        return self.param_count()

    def embedding_params(self) -> int:
        """The input embedding table: looked up (one row per token), never a
        matmul, so not in the FLOPs and not read whole each iteration."""
        return self.vocab_size * self.hidden_size

    def matmul_params_per_token(self) -> int:
        """Weights one token multiplies with: active parameters less the input
        embedding (the LM head stays: it is a matmul, tied or not; norms and
        biases are kept, a rounding error)."""
        return self.active_param_count() - self.embedding_params()

    def forward_flops_per_token(self) -> int:
        """Linear-layer FLOPs of one token's forward pass: 2 per weight
        (multiply and add)."""
        return 2 * self.matmul_params_per_token()

    def attention_flops_per_pair(self) -> int:
        """FLOPs of one (query token, key token) pair over all layers: QK^T and
        PV are ``2 * heads * head_dim`` each."""
        return 4 * self.num_attention_heads * self.head_dim * self.num_layers

    def expert_params(self) -> int:
        """Parameters in all experts' MLPs (0 for a dense model)."""
        if not self.is_moe:
            return 0
        return self.num_layers * self.num_experts * 3 * self.hidden_size * self.intermediate_size

    def weights_read_bytes(self, tokens: int) -> float:
        """Weight bytes an iteration of ``tokens`` tokens reads from HBM.

        Dense: every matmul weight once (the embedding table only for the
        rows looked up, neglected). MoE: the shared weights plus the experts
        the tokens touch; with uniform top-k routing a layer's expected number
        of touched experts is ``E * (1 - (1 - k/E)^tokens)``.
        """
        if tokens <= 0:
            return 0.0
        dense = self.param_count() - self.embedding_params()
        if not self.is_moe:
            return float(dense * self.weight_dtype_bytes)
        experts = self.expert_params()
        e, k = self.num_experts, self.experts_per_token
        touched = 1.0 - (1.0 - k / e) ** tokens
        return float((dense - experts + experts * touched) * self.weight_dtype_bytes)


def _model(
    name: str,
    *,
    num_layers: int,
    hidden_size: int,
    intermediate_size: int,
    num_attention_heads: int,
    num_kv_heads: int,
    vocab_size: int,
    source: str,
    num_experts: int = 1,
    experts_per_token: int = 1,
    qkv_bias: bool = False,
    tie_word_embeddings: bool = False,
) -> ModelProfile:
    """A bf16 model from its config.json facts; head_dim = hidden / heads."""
    head_dim = hidden_size // num_attention_heads
    params = count_params(
        num_layers=num_layers,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_attention_heads=num_attention_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        vocab_size=vocab_size,
        num_experts=num_experts,
        qkv_bias=qkv_bias,
        tie_word_embeddings=tie_word_embeddings,
    )
    return ModelProfile(
        name=name,
        num_layers=num_layers,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        kv_dtype_bytes=2,
        param_bytes=params * 2,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_attention_heads=num_attention_heads,
        vocab_size=vocab_size,
        num_experts=num_experts,
        experts_per_token=experts_per_token,
        qkv_bias=qkv_bias,
        tie_word_embeddings=tie_word_embeddings,
        weight_dtype_bytes=2,
        source=source,
    )


# The papers' models. Numbers: config.json of each Hugging Face repository
# (num_hidden_layers, hidden_size, intermediate_size, num_attention_heads,
# num_key_value_heads, vocab_size, tie_word_embeddings, and for Mixtral
# num_local_experts / num_experts_per_tok). Counted totals vs the model cards:
# Llama-3-8B 8,030,261,248 ("8B"; HF shows 8.03B); Llama-3/3.1-70B
# 70,553,706,496 ("70B"; HF 70.6B); Qwen2.5-14B 14,770,033,664 (card 14.7B);
# Qwen2.5-32B 32,763,876,352 (card 32.5B, HF 32.8B); Mixtral-8x7B
# 46,702,792,704 total, 12,879,925,248 active (46.7B / 12.9B in the paper
# "Mixtral of Experts").
_BUILTIN_MODELS = (
    # meta-llama/Meta-Llama-3-8B config.json: 32 layers, hidden 4096,
    # intermediate 14336, 32 heads, 8 KV heads, vocab 128256, untied.
    _model(
        "llama-3-8b",
        num_layers=32,
        hidden_size=4096,
        intermediate_size=14336,
        num_attention_heads=32,
        num_kv_heads=8,
        vocab_size=128256,
        source="meta-llama/Meta-Llama-3-8B config.json",
    ),
    # meta-llama/Meta-Llama-3-70B config.json: 80 layers, hidden 8192,
    # intermediate 28672, 64 heads, 8 KV heads, vocab 128256, untied.
    _model(
        "llama-3-70b",
        num_layers=80,
        hidden_size=8192,
        intermediate_size=28672,
        num_attention_heads=64,
        num_kv_heads=8,
        vocab_size=128256,
        source="meta-llama/Meta-Llama-3-70B config.json",
    ),
    # meta-llama/Llama-3.1-70B config.json: the same shape as Llama-3-70B
    # (only rope scaling and the 128K context differ).
    _model(
        "llama-3.1-70b",
        num_layers=80,
        hidden_size=8192,
        intermediate_size=28672,
        num_attention_heads=64,
        num_kv_heads=8,
        vocab_size=128256,
        source="meta-llama/Llama-3.1-70B config.json",
    ),
    # Qwen/Qwen2.5-14B config.json: 48 layers, hidden 5120, intermediate
    # 13824, 40 heads, 8 KV heads, vocab 152064, untied; q/k/v biases.
    _model(
        "qwen2.5-14b",
        num_layers=48,
        hidden_size=5120,
        intermediate_size=13824,
        num_attention_heads=40,
        num_kv_heads=8,
        vocab_size=152064,
        qkv_bias=True,
        source="Qwen/Qwen2.5-14B config.json",
    ),
    # Qwen/Qwen2.5-32B config.json: 64 layers, hidden 5120, intermediate
    # 27648, 40 heads, 8 KV heads, vocab 152064, untied; q/k/v biases.
    # SuperInfer §4.3.1: a 16-token block is 64 KB per layer, 4 MB in all.
    _model(
        "qwen2.5-32b",
        num_layers=64,
        hidden_size=5120,
        intermediate_size=27648,
        num_attention_heads=40,
        num_kv_heads=8,
        vocab_size=152064,
        qkv_bias=True,
        source="Qwen/Qwen2.5-32B config.json",
    ),
    # mistralai/Mixtral-8x7B-v0.1 config.json: 32 layers, hidden 4096,
    # intermediate 14336 (per expert), 32 heads, 8 KV heads, vocab 32000,
    # untied, num_local_experts 8, num_experts_per_tok 2.
    _model(
        "mixtral-8x7b",
        num_layers=32,
        hidden_size=4096,
        intermediate_size=14336,
        num_attention_heads=32,
        num_kv_heads=8,
        vocab_size=32000,
        num_experts=8,
        experts_per_token=2,
        source="mistralai/Mixtral-8x7B-v0.1 config.json",
    ),
)

MODEL_PROFILES: dict[str, ModelProfile] = {p.name: p for p in _BUILTIN_MODELS}

# Other spellings the lookup helpers accept (not keys of MODEL_PROFILES, so the
# service's list of names stays one per model).
MODEL_ALIASES: dict[str, str] = {
    "meta-llama-3-8b": "llama-3-8b",
    "llama-3.1-8b": "llama-3-8b",
    "meta-llama-3-70b": "llama-3-70b",
    "mixtral-8x7b-v0.1": "mixtral-8x7b",
}


def find_model(name: str) -> ModelProfile | None:
    """A built-in model by name or alias (case-insensitive), else None."""
    key = name.strip().lower()
    key = MODEL_ALIASES.get(key, key)
    return MODEL_PROFILES.get(key)
