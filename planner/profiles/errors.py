"""The one error type of the profiles package."""

from __future__ import annotations


class ProfileError(ValueError):
    """A profile is wrong or not enough for what was asked of it.

    ``field`` names the offending field as a path (``link.h2d.points[2].gbps``,
    ``hardware.peak_bf16_tflops``, ``tensor_parallel``); ``reason`` says what is
    wrong with it. ``str()`` is ``"field: reason"``.
    """

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason
