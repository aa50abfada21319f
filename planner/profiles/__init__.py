"""Model and hardware profiles: built-in ones from public specifications, a
link model, an iteration cost model, and measured profiles loaded from JSON.

- :mod:`.models` — :class:`ModelProfile` and the built-in models;
- :mod:`.hardware` — :class:`HardwareProfile` and the built-in machines;
- :mod:`.link` — bandwidth vs transfer size and direction, duplex behaviour;
- :mod:`.cost` — :class:`IterationCostModel` (iteration time, KV capacity);
- :mod:`.loading` — the measured-profile JSON format, ``load_profile`` /
  ``save_profile``.
"""

from __future__ import annotations

from planner.profiles.cost import CostConstants, IterationCostModel
from planner.profiles.errors import ProfileError
from planner.profiles.hardware import (
    HARDWARE_ALIASES,
    HARDWARE_PROFILES,
    HardwareProfile,
    find_hardware,
)
from planner.profiles.link import (
    DuplexPoint,
    LinkModel,
    MeasuredCurve,
    MeasuredPoint,
    SaturatingCurve,
)
from planner.profiles.loading import MeasuredProfile, load_profile, save_profile
from planner.profiles.models import (
    GB,
    GIB,
    MODEL_ALIASES,
    MODEL_PROFILES,
    ModelProfile,
    count_params,
    find_model,
)

__all__ = [
    "GB",
    "GIB",
    "HARDWARE_ALIASES",
    "HARDWARE_PROFILES",
    "MODEL_ALIASES",
    "MODEL_PROFILES",
    "CostConstants",
    "DuplexPoint",
    "HardwareProfile",
    "IterationCostModel",
    "LinkModel",
    "MeasuredCurve",
    "MeasuredPoint",
    "MeasuredProfile",
    "ModelProfile",
    "ProfileError",
    "SaturatingCurve",
    "count_params",
    "find_hardware",
    "find_model",
    "load_profile",
    "save_profile",
]
