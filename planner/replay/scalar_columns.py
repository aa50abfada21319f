"""The request columns that a small batch reads and writes one request at a
time, as memoryviews over the columns' own buffers: indexing one reads or
writes a Python int or float, about three times cheaper than ndarray.item
and a numpy scalar store. Writes through a view are writes to the column.

The columns are allocated once per run and never replaced, so views taken at
the start stay on them."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from planner.replay.state import FloatArray, RequestColumns


def int_view(column: npt.NDArray[np.int64] | npt.NDArray[np.int32]) -> memoryview[int]:
    """A view of an int column (int64 or int32)."""
    return column.data.cast("B").cast("q" if column.dtype == np.int64 else "i")


def float_view(column: FloatArray) -> memoryview[float]:
    return column.data.cast("B").cast("d")


class ScalarColumns:
    __slots__ = (
        "first_token_s",
        "generated",
        "gpu_blocks",
        "kv_tokens",
        "last_token_s",
        "output_tokens",
        "prefill_target",
    )

    def __init__(self, requests: RequestColumns) -> None:
        self.kv_tokens = int_view(requests.kv_tokens)
        self.prefill_target = int_view(requests.prefill_target)
        self.gpu_blocks = int_view(requests.gpu_blocks)
        self.generated = int_view(requests.generated)
        self.output_tokens = int_view(requests.output_tokens)
        self.first_token_s = float_view(requests.first_token_s)
        self.last_token_s = float_view(requests.last_token_s)
