"""The loads `planner bench calibration` serves: a steady Poisson stream that
never fills the KV pool, and bursts that overflow it (preemptions). Lengths
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

    def arrivals_s(self) -> list[float]:
        rng = random.Random(self.seed)
        times: list[float] = []
        if self.rate_rps > 0:
            t = rng.expovariate(self.rate_rps)
            while t < self.duration_s:
                times.append(t)
                t += rng.expovariate(self.rate_rps)
        for b in range(self.num_bursts):
            times += [
                b * self.burst_gap_s + rng.uniform(0, self.burst_spread_s)
                for _ in range(self.burst_size)
            ]
        return sorted(times)

    def requests(self, salt: int) -> list[StreamRequest]:
        """The load's requests; prompt words drawn from salt (lengths do not
        depend on it)."""
        rng = random.Random(self.seed + 1)
        out = []
        for i, at in enumerate(self.arrivals_s()):
            words = rng.randint(*self.prompt_words)
            tokens = rng.randint(*self.output_tokens)
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
