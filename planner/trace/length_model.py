"""Where (prompt, output) length pairs come from: two independent
distributions (a preset or explicit specs), or pairs resampled from a file.
Clamps (--max-prompt-tokens / --max-output-tokens) apply to either."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from planner.trace.errors import SpecError
from planner.trace.lengths import IntArray, LengthDist, parse_dist
from planner.trace.presets import PRESETS


class LengthModel(Protocol):
    def sample(self, rng: np.random.Generator, n: int) -> tuple[IntArray, IntArray]: ...

    def describe(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Independent:
    prompt: LengthDist
    output: LengthDist
    name: str | None = None

    def sample(self, rng: np.random.Generator, n: int) -> tuple[IntArray, IntArray]:
        # Prompt lengths first, then outputs: each side's stream does not
        # depend on the other's distribution kind.
        prompt_rng, output_rng = rng.spawn(2)
        return self.prompt.sample(prompt_rng, n), self.output.sample(output_rng, n)

    def describe(self) -> str:
        if self.name is not None:
            return f"preset {self.name}"
        return f"prompt {self.prompt.spec()}, output {self.output.spec()}"


@dataclass(frozen=True, slots=True)
class Resampled:
    """Pairs drawn uniformly with replacement, so each pair stays together."""

    prompt_tokens: IntArray
    output_tokens: IntArray
    source: str

    def sample(self, rng: np.random.Generator, n: int) -> tuple[IntArray, IntArray]:
        index = rng.integers(0, len(self.prompt_tokens), size=n)
        return self.prompt_tokens[index], self.output_tokens[index]

    def describe(self) -> str:
        return f"resampled from {self.source} ({len(self.prompt_tokens)} pairs)"


@dataclass(frozen=True, slots=True)
class Clamped:
    inner: LengthModel
    max_prompt_tokens: int | None
    max_output_tokens: int | None

    def sample(self, rng: np.random.Generator, n: int) -> tuple[IntArray, IntArray]:
        prompt, output = self.inner.sample(rng, n)
        if self.max_prompt_tokens is not None:
            prompt = np.minimum(prompt, self.max_prompt_tokens)
        if self.max_output_tokens is not None:
            output = np.minimum(output, self.max_output_tokens)
        return prompt, output

    def describe(self) -> str:
        clamps = [
            f"{side} <= {cap}"
            for side, cap in (
                ("prompt", self.max_prompt_tokens),
                ("output", self.max_output_tokens),
            )
            if cap is not None
        ]
        inner = self.inner.describe()
        return f"{inner}, clamped {' and '.join(clamps)}" if clamps else inner


def preset_or_dist(text: str) -> Independent:
    """--lengths: a preset name, or one distribution spec used for both the
    prompt and the output."""
    name = text.strip()
    if name in PRESETS:
        preset = PRESETS[name]
        return Independent(preset.prompt, preset.output, name)
    if ":" not in name:
        known = ", ".join(sorted(PRESETS))
        raise SpecError("--lengths", f"unknown preset {name!r} (presets: {known})")
    dist = parse_dist(name, "--lengths")
    return Independent(dist, dist)


def build_length_model(
    *,
    lengths: str | None,
    prompt_lengths: str | None,
    output_lengths: str | None,
    max_prompt_tokens: int | None,
    max_output_tokens: int | None,
    resampled: Resampled | None = None,
    default: str | None = "sharegpt",
) -> LengthModel:
    """The length model the options ask for. --lengths-file (passed in as
    `resampled`) excludes the others; --prompt-lengths / --output-lengths
    override one side of --lengths (or of the default preset)."""
    caps = (("--max-prompt-tokens", max_prompt_tokens), ("--max-output-tokens", max_output_tokens))
    for option, cap in caps:
        if cap is not None and cap < 1:
            raise SpecError(option, f"must be >= 1, got {cap}")
    model: LengthModel
    if resampled is not None:
        if lengths is not None or prompt_lengths is not None or output_lengths is not None:
            raise SpecError(
                "--lengths-file",
                "cannot be combined with --lengths/--prompt-lengths/--output-lengths",
            )
        model = resampled
    else:
        base_text = lengths if lengths is not None else default
        base = preset_or_dist(base_text) if base_text is not None else None
        prompt = (
            parse_dist(prompt_lengths, "--prompt-lengths")
            if prompt_lengths is not None
            else (base.prompt if base is not None else None)
        )
        output = (
            parse_dist(output_lengths, "--output-lengths")
            if output_lengths is not None
            else (base.output if base is not None else None)
        )
        if prompt is None or output is None:
            raise SpecError(
                "--lengths",
                "no lengths given: use --lengths, --prompt-lengths and --output-lengths, "
                "or --lengths-file",
            )
        if base is not None and prompt_lengths is None and output_lengths is None:
            model = base
        else:
            model = Independent(prompt, output)
    if max_prompt_tokens is None and max_output_tokens is None:
        return model
    return Clamped(model, max_prompt_tokens, max_output_tokens)
