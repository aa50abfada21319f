"""Swap a request's KV between SGLang's device pool and its host KV pool.

SGLang indexes KV by token slot. Where the host pool's layout keeps one
layer's K (or V) as a ``(tokens, H_kv, D)`` view, exactly like the device
pool's per-layer buffers (``layer_first`` and ``page_first``), the copy is
``planner.kernels``' block transfer with a token slot as the block, one
gather/scatter per layer and K/V. Other layouts (``page_first_direct``,
``page_head``, ``page_unified``) go through SGLang's own host-pool copy API
(``backup_from_device_all_layer`` / ``load_to_device_per_layer``)."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from planner.kernels.transfer_ref import copy_blocks_reference

from .engine_types import DeviceKVPool, HostKVPool

VIEWABLE_LAYOUTS = ("layer_first", "page_first")


def host_layer_view(host: HostKVPool, kv: int, layer: int) -> torch.Tensor:
    """``(tokens, H_kv, D)`` view of one layer's K (kv=0) or V (kv=1)."""
    if host.layout == "layer_first":
        return host.kv_buffer[kv, layer]
    if host.layout == "page_first":
        return host.kv_buffer[kv, :, layer]
    raise ValueError(f"host layout {host.layout!r} has no per-layer token view")


def _pairs(device: DeviceKVPool, host: HostKVPool) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for kv, buffers in enumerate((device.k_buffer, device.v_buffer)):
        for layer, device_layer in enumerate(buffers):
            yield device_layer, host_layer_view(host, kv, layer)


class HostSwap:
    """``io_backend`` is passed to SGLang's copy API for layouts the
    planner's kernels cannot address ("kernel" or "direct" in SGLang)."""

    def __init__(self, device: DeviceKVPool, host: HostKVPool, io_backend: str = "direct") -> None:
        self.device = device
        self.host = host
        self.io_backend = io_backend

    @property
    def uses_planner_kernels(self) -> bool:
        return self.host.layout in VIEWABLE_LAYOUTS

    def swap_out(self, device_indices: torch.Tensor) -> torch.Tensor | None:
        """Copy the tokens at ``device_indices`` to freshly allocated host
        slots and return those slots; None when the host pool is full (the
        caller then leaves the request to SGLang's recompute)."""
        host_indices = self.host.alloc(len(device_indices))
        if host_indices is None:
            return None
        if self.uses_planner_kernels:
            for device_layer, host_layer in _pairs(self.device, self.host):
                copy_blocks_reference(device_layer, host_layer, device_indices, host_indices)
        else:
            self.host.backup_from_device_all_layer(
                self.device, host_indices, device_indices, self.io_backend
            )
        return host_indices

    def swap_in(self, host_indices: torch.Tensor, device_indices: torch.Tensor) -> None:
        """Copy host slots back to ``device_indices`` and free the slots."""
        if len(host_indices) != len(device_indices):
            raise ValueError(
                f"device_indices has {len(device_indices)} slots for {len(host_indices)} host slots"
            )
        if self.uses_planner_kernels:
            for device_layer, host_layer in _pairs(self.device, self.host):
                copy_blocks_reference(host_layer, device_layer, host_indices, device_indices)
        else:
            for layer in range(len(self.device.k_buffer)):
                self.host.load_to_device_per_layer(
                    self.device, host_indices, device_indices, layer, self.io_backend
                )
        self.host.free(host_indices)
