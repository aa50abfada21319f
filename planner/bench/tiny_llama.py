"""A tiny Llama that vLLM can serve with no model hub: its config, random
weights (seeded) and a byte-level BPE tokenizer trained here on generated
text. Needs torch, transformers and tokenizers (the engine environment,
.venv-engines); nothing is downloaded.

    python -m planner.bench.tiny_llama DIR
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# Words the tokenizer is trained on and prompts are made of.
_SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "sa", "te", "vo", "zu", "pi", "da", "fe", "gu", "ho")
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")


@dataclass(frozen=True, slots=True)
class TinyLlamaShape:
    hidden_size: int = 256
    intermediate_size: int = 512
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    vocab_size: int = 2048
    max_position_embeddings: int = 4096
    # Larger than Llama's 0.02 so that logits are far apart: greedy choices
    # do not flip on float rounding between batch shapes.
    initializer_range: float = 0.2


def words(count: int, seed: int) -> list[str]:
    """count pseudo-words from the syllable alphabet, deterministic in seed."""
    rng = random.Random(seed)
    return ["".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(count)]


def prompt_text(num_words: int, seed: int) -> str:
    return " ".join(words(num_words, seed))


def build(out_dir: Path, shape: TinyLlamaShape | None = None, seed: int = 0) -> Path:
    """Writes config.json, model.safetensors and the tokenizer files to
    out_dir; returns out_dir. Deterministic in seed."""
    # torch, tokenizers and transformers: the engines environment only.
    import torch  # noqa: PLC0415 - optional
    from tokenizers import (  # noqa: PLC0415 - optional
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        trainers,
    )
    from transformers import (  # noqa: PLC0415 - optional
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedTokenizerFast,
    )

    shape = shape or TinyLlamaShape()
    out_dir.mkdir(parents=True, exist_ok=True)

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=shape.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [prompt_text(64, seed * 100_003 + i) for i in range(2_000)]
    bpe.train_from_iterator(corpus, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    tokenizer.save_pretrained(out_dir)

    config = LlamaConfig(
        **asdict(shape),
        rms_norm_eps=1e-5,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(out_dir, safe_serialization=True)
    meta: dict[str, Any] = {"seed": seed, **asdict(shape)}
    (out_dir / "tiny_llama.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
    return out_dir


def cached(cache_dir: Path, seed: int = 0) -> Path:
    """The model of build(seed) under cache_dir, built there once. A stable
    path lets vLLM reuse its torch.compile cache (keyed by the model path)
    from one run to the next: about 30 s per server start on 2 cores."""
    out = cache_dir / f"tiny-llama-seed{seed}"
    meta = {"seed": seed, **asdict(TinyLlamaShape())}
    marker = out / "tiny_llama.json"
    if marker.exists() and json.loads(marker.read_text(encoding="utf-8")) == meta:
        return out
    staging = Path(tempfile.mkdtemp(prefix=f"{out.name}-", dir=cache_dir))
    build(staging, seed=seed)
    shutil.rmtree(out, ignore_errors=True)
    try:
        staging.rename(out)
    except OSError:
        # Another process put it there first: same seed, same files.
        shutil.rmtree(staging, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    build(args.out_dir, seed=args.seed)
    print(args.out_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
