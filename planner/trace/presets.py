"""Built-in length presets, fitted once to public length statistics.

Each preset is a pair of `Quantiles` distributions (prompt, output): a
piecewise log-linear quantile function through the 0, 1, 5, 10, 25, 50, 75,
90, 95, 99 and 100th percentiles of the source (numpy's linear percentile,
rounded to whole tokens). Eleven numbers per side are a derived statistic of
the public file, not its data. Prompt and output are drawn independently:
the correlation of their logarithms is small in every source (0.06 ShareGPT,
0.09 Azure conversation, -0.005 Azure code).

Why not a plain lognormal: fitted by the moments of ln(tokens), ShareGPT's
prompts give median 1104 and sigma 1.63, but the observed median is 1730 and
the tail is cut at 8k, so p50/p90/p99 would be far off. The quantile form
reproduces the source's percentiles at the knots and its mean within 2 %
(Azure code's output mean within 17 %: the tail between its p99, 251, and
its max, 1899, is interpolated log-linearly). `lognormal:...` remains
available as an explicit spec.

Fits (source file in ../shared/traces → source mean, p50/p90/p99 vs a
400k-sample draw of the preset):

- sharegpt — sharegpt_8k_filtered_stats_llama2_tokenizer.csv (ShareGPT as
  processed by microsoft/sarathi-serve, Llama-2 tokenizer, total <= 8k;
  30,731 conversations). Prompt: mean 2340, p50 1730, p90 5696, p99 7434
  (preset: 2313, 1725, 5691, 7436). Output: mean 438.7, p50 415, p90 834,
  p99 998 (preset: 433.4, 414, 835, 998).
- azure-conv — AzureLLMInferenceTrace_conv.csv (Azure LLM inference trace
  2023, conversation; 19,366 requests). Prompt: mean 1155, p50 1020, p90
  2734, p99 4142 (preset: 1190, 1021, 2727, 4206). Output: mean 211.1, p50
  129, p90 424, p99 601 (preset: 211.5, 129, 424, 604).
- azure-code — AzureLLMInferenceTrace_code.csv (code completion; 8,819
  requests). Prompt: mean 2048, p50 1469, p90 5188, p99 7436 (preset: 2055,
  1469, 5180, 7436). Output: mean 27.9, p50 13, p90 55, p99 251 (preset:
  32.5, 13, 55, 249).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.trace.lengths import Quantiles

PERCENTILES: tuple[float, ...] = (0, 1, 5, 10, 25, 50, 75, 90, 95, 99, 100)


@dataclass(frozen=True, slots=True)
class Preset:
    name: str
    source: str
    prompt: Quantiles
    output: Quantiles


def _preset(name: str, source: str, prompt: tuple[int, ...], output: tuple[int, ...]) -> Preset:
    return Preset(name, source, Quantiles(PERCENTILES, prompt), Quantiles(PERCENTILES, output))


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        _preset(
            "sharegpt",
            "ShareGPT (sarathi-serve stats, Llama-2 tokenizer, total <= 8k)",
            (1, 12, 29, 74, 580, 1730, 3734, 5696, 6563, 7434, 8141),
            (2, 6, 44, 84, 228, 415, 628, 834, 920, 998, 1024),
        ),
        _preset(
            "azure-conv",
            "Azure LLM inference trace 2023, conversation",
            (2, 29, 181, 207, 396, 1020, 1189, 2734, 4083, 4142, 14050),
            (7, 16, 41, 54, 85, 129, 395, 424, 451, 601, 1000),
        ),
        _preset(
            "azure-code",
            "Azure LLM inference trace 2023, code completion",
            (3, 17, 75, 147, 578, 1469, 2744, 5188, 7303, 7436, 7437),
            (6, 6, 6, 7, 9, 13, 24, 55, 90, 251, 1899),
        ),
    )
}
