"""The loads `planner bench calibration` serves: a steady Poisson stream that
never fills the KV pool, bursts that overflow it (preemptions), and long
decodes in bursts over a stream of short requests (the rotation acts). Lengths
and arrival times depend on the seed only; the prompts' words on a salt as
well, so that one server can take several runs without a prefix-cache hit
from an earlier one while the lengths stay the same."""

from __future__ import annotations

import random
from dataclasses import dataclass

from planner.bench.openai_stream import StreamRequest
from planner.bench.tiny_llama import prompt_text


@dataclass(frozen=True, slots=True)
class CalibrationLoad:
    name: str
    what: str
    # Poisson arrivals at rate_rps for duration_s, or num_bursts bursts of
    # burst_size requests burst_gap_s apart (each spread over burst_spread_s).
    rate_rps: float = 0.0
    duration_s: float = 0.0
    num_bursts: int = 0
    burst_size: int = 0
    burst_gap_s: float = 5.0
    burst_spread_s: float = 0.5
    prompt_words: tuple[int, int] = (40, 200)
    output_tokens: tuple[int, int] = (16, 96)
    seed: int = 0
    # With rate_rps as well: the bursts' requests ask for these instead (long
    # decodes holding the KV pool while the Poisson stream's short requests
    # arrive); None: every request draws from prompt_words and output_tokens.
    burst_prompt_words: tuple[int, int] | None = None
    burst_output_tokens: tuple[int, int] | None = None

    def arrivals_s(self) -> list[float]:
        return [t for t, _ in self._arrivals()]

    def _arrivals(self) -> list[tuple[float, bool]]:
        """Each request's arrival and whether it came in a burst, in order."""
        rng = random.Random(self.seed)
        times: list[tuple[float, bool]] = []
        if self.rate_rps > 0:
            t = rng.expovariate(self.rate_rps)
            while t < self.duration_s:
                times.append((t, False))
                t += rng.expovariate(self.rate_rps)
        for b in range(self.num_bursts):
            times += [
                (b * self.burst_gap_s + rng.uniform(0, self.burst_spread_s), True)
                for _ in range(self.burst_size)
            ]
        return sorted(times)

    def requests(self, salt: int) -> list[StreamRequest]:
        """The load's requests; prompt words drawn from salt (lengths do not
        depend on it)."""
        rng = random.Random(self.seed + 1)
        out = []
        for i, (at, in_burst) in enumerate(self._arrivals()):
            long = in_burst and self.rate_rps > 0
            words = rng.randint(*self.prompt_words)
            tokens = rng.randint(*self.output_tokens)
            if long and self.burst_prompt_words is not None:
                words = rng.randint(*self.burst_prompt_words)
            if long and self.burst_output_tokens is not None:
                tokens = rng.randint(*self.burst_output_tokens)
            out.append(
                StreamRequest(
                    id=f"{self.name}-{i}",
                    send_at_s=at,
                    prompt=prompt_text(words, salt * 100_003 + i),
                    max_tokens=tokens,
                )
            )
        return out


LOADS = {
    "steady": CalibrationLoad(
        "steady",
        "Poisson arrivals at 6 requests/s for 15 s: the KV pool never fills",
        rate_rps=6.0,
        duration_s=15.0,
    ),
    "bursts": CalibrationLoad(
        "bursts",
        "3 bursts of 40 requests 5 s apart: each overflows the KV pool (preemptions)",
        num_bursts=3,
        burst_size=40,
    ),
    "rotation": CalibrationLoad(
        "rotation",
        "3 bursts of 7 long requests (280-360 words, 400-500 tokens) 5 s apart over "
        "Poisson short requests at 2/s for 15 s: the long decodes fill the KV pool while "
        "short ones wait, so the rotation's plans preempt",
        rate_rps=2.0,
        duration_s=15.0,
        num_bursts=3,
        burst_size=7,
        burst_prompt_words=(280, 360),
        burst_output_tokens=(400, 500),
    ),
}
QUICK_LOADS = {
    "steady": CalibrationLoad(
        "steady",
        "Poisson arrivals at 6 requests/s for 6 s: the KV pool never fills",
        rate_rps=6.0,
        duration_s=6.0,
    ),
    "bursts": CalibrationLoad(
        "bursts",
        "2 bursts of 40 requests 5 s apart: each overflows the KV pool (preemptions)",
        num_bursts=2,
        burst_size=40,
    ),
}
