"""Length distributions for prompts and outputs, and their text specs.

A spec is ``KIND:KEY=VALUE,...``:

- ``fixed:N`` (or ``fixed:value=N``): always N tokens.
- ``uniform:low=A,high=B``: an integer uniform on [A, B].
- ``lognormal:median=M,sigma=S[,max=X]``: round(exp(N(ln M, S²))), at least
  1; with max, truncated at X by redrawing (the distribution conditioned on
  <= X, not a spike at X).
- ``quantiles:P=V,P=V,...``: a piecewise log-linear quantile function
  through the points (percentile P in [0, 100], value V tokens); the
  percentiles must include 0 and 100 and increase, the values must not
  decrease. Sampling is by inverse CDF: u ~ U(0, 100), interpolate ln V.
  The built-in presets (`planner.trace.presets`) are of this kind.

Samples are integers >= 1.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from planner.trace.errors import SpecError

IntArray = npt.NDArray[np.int64]

_MAX_REDRAWS = 1000


class LengthDist(Protocol):
    def sample(self, rng: np.random.Generator, n: int) -> IntArray: ...

    def spec(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Fixed:
    value: int

    def sample(self, rng: np.random.Generator, n: int) -> IntArray:
        return np.full(n, self.value, dtype=np.int64)

    def spec(self) -> str:
        return f"fixed:{self.value}"


@dataclass(frozen=True, slots=True)
class Uniform:
    low: int
    high: int

    def sample(self, rng: np.random.Generator, n: int) -> IntArray:
        return rng.integers(self.low, self.high, size=n, endpoint=True, dtype=np.int64)

    def spec(self) -> str:
        return f"uniform:low={self.low},high={self.high}"


@dataclass(frozen=True, slots=True)
class LogNormal:
    median: float
    sigma: float
    max: int | None = None

    def _draw(self, rng: np.random.Generator, n: int) -> IntArray:
        x = np.rint(np.exp(rng.normal(math.log(self.median), self.sigma, n)))
        return np.maximum(x, 1).astype(np.int64)

    def sample(self, rng: np.random.Generator, n: int) -> IntArray:
        out = self._draw(rng, n)
        if self.max is None:
            return out
        for _ in range(_MAX_REDRAWS):
            over = out > self.max
            k = int(over.sum())
            if k == 0:
                return out
            out[over] = self._draw(rng, k)
        raise SpecError("--lengths", f"{self.spec()}: max is too far in the tail to sample")

    def spec(self) -> str:
        tail = "" if self.max is None else f",max={self.max}"
        return f"lognormal:median={self.median:g},sigma={self.sigma:g}{tail}"


@dataclass(frozen=True, slots=True)
class Quantiles:
    """Piecewise log-linear quantile function through (percentile, tokens)."""

    percentiles: tuple[float, ...]
    values: tuple[int, ...]

    def __post_init__(self) -> None:
        p, v = self.percentiles, self.values
        if len(p) != len(v) or len(p) < 2 or p[0] != 0 or p[-1] != 100:
            raise SpecError("--lengths", "quantiles need points at percentiles 0 and 100")
        if any(b <= a for a, b in itertools.pairwise(p)):
            raise SpecError("--lengths", "quantile percentiles must increase")
        if any(b < a for a, b in itertools.pairwise(v)) or v[0] < 1:
            raise SpecError("--lengths", "quantile values must be >= 1 and not decrease")

    def sample(self, rng: np.random.Generator, n: int) -> IntArray:
        u = rng.uniform(0.0, 100.0, n)
        log_v = np.log(np.asarray(self.values, dtype=np.float64))
        x = np.rint(np.exp(np.interp(u, np.asarray(self.percentiles), log_v)))
        return np.maximum(x, 1).astype(np.int64)

    def spec(self) -> str:
        pts = ",".join(f"{p:g}={v}" for p, v in zip(self.percentiles, self.values, strict=True))
        return f"quantiles:{pts}"


def _params(option: str, kind: str, body: str) -> dict[str, str]:
    params: dict[str, str] = {}
    for part in filter(None, (x.strip() for x in body.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise SpecError(option, f"{kind}: expected KEY=VALUE, got {part!r}")
        if key.strip() in params:
            raise SpecError(option, f"{kind}: {key.strip()} given twice")
        params[key.strip()] = value.strip()
    return params


def _int_param(option: str, kind: str, key: str, text: str, minimum: int = 1) -> int:
    try:
        value = int(text)
    except ValueError:
        raise SpecError(option, f"{kind}: {key} must be an integer, got {text!r}") from None
    if value < minimum:
        raise SpecError(option, f"{kind}: {key} must be >= {minimum}, got {value}")
    return value


def _float_param(option: str, kind: str, key: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise SpecError(option, f"{kind}: {key} must be a finite number > 0, got {text!r}")
    return value


def _expect(option: str, kind: str, params: dict[str, str], keys: set[str], need: set[str]) -> None:
    unknown = sorted(set(params) - keys)
    if unknown:
        raise SpecError(option, f"{kind}: unknown parameter {unknown[0]!r} (known: {sorted(keys)})")
    missing = sorted(need - set(params))
    if missing:
        raise SpecError(option, f"{kind}: missing parameter {missing[0]!r}")


def parse_dist(text: str, option: str = "--lengths") -> LengthDist:
    """A distribution spec (see the module docstring) → a LengthDist."""
    kind, _, body = text.strip().partition(":")
    kind = kind.strip()
    if kind == "fixed":
        if body.strip() and "=" not in body:
            return Fixed(_int_param(option, kind, "value", body.strip()))
        params = _params(option, kind, body)
        _expect(option, kind, params, {"value"}, {"value"})
        return Fixed(_int_param(option, kind, "value", params["value"]))
    if kind == "uniform":
        params = _params(option, kind, body)
        _expect(option, kind, params, {"low", "high"}, {"low", "high"})
        low = _int_param(option, kind, "low", params["low"])
        high = _int_param(option, kind, "high", params["high"])
        if high < low:
            raise SpecError(option, f"uniform: high ({high}) must be >= low ({low})")
        return Uniform(low, high)
    if kind == "lognormal":
        params = _params(option, kind, body)
        _expect(option, kind, params, {"median", "sigma", "max"}, {"median", "sigma"})
        cap = _int_param(option, kind, "max", params["max"]) if "max" in params else None
        median = _float_param(option, kind, "median", params["median"])
        if cap is not None and median > cap:
            raise SpecError(option, f"lognormal: median ({median:g}) must be <= max ({cap})")
        return LogNormal(median, _float_param(option, kind, "sigma", params["sigma"]), cap)
    if kind == "quantiles":
        params = _params(option, kind, body)
        points: list[tuple[float, int]] = []
        for key, value in params.items():
            try:
                pct = float(key)
            except ValueError:
                raise SpecError(option, f"quantiles: {key!r} is not a percentile") from None
            if not 0 <= pct <= 100:
                raise SpecError(option, f"quantiles: percentile {key} is outside [0, 100]")
            points.append((pct, _int_param(option, kind, f"value at {key}", value)))
        points.sort()
        try:
            return Quantiles(tuple(p for p, _ in points), tuple(v for _, v in points))
        except SpecError as exc:
            raise SpecError(option, exc.reason) from None
    raise SpecError(
        option,
        f"unknown distribution {kind!r} (use fixed:N, uniform:low=A,high=B, "
        "lognormal:median=M,sigma=S[,max=X], quantiles:P=V,... or a preset name)",
    )
