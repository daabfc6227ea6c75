"""Argument checks at the Python boundary and the per-device pieces every op needs (stream,
error counter). Messages name the argument and say what was expected and what was given."""
from __future__ import annotations

import torch

from ._abi import DEVICE_HOST

_int32 = torch.int32
_float32 = torch.float32
_current_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def device_index(t: torch.Tensor) -> int:
    """The C ABI's device field for a tensor: CUDA ordinal, or DEVICE_HOST for CPU memory."""
    if t.device.type == "cuda":
        return t.device.index
    if t.device.type == "cpu":
        return DEVICE_HOST
    raise ValueError(f"tensors must be on the CPU or a CUDA device (got {t.device})")


def resolve_device(device) -> torch.device:
    """torch.device(device), with a bare "cuda" pinned to the current CUDA device."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def current_stream(device: int) -> int:
    """Raw handle of the framework's current stream on `device` (0 for the host backend)."""
    return 0 if device < 0 else _current_raw_stream(device)


def check(t, name: str, dtype, shape: tuple, device: torch.device) -> torch.Tensor:
    """Checks one tensor argument; `shape` entries of None match any size. Returns t."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor (got {type(t).__name__})")
    if t.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype} (got {t.dtype})")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but the other tensors are on {device}")
    if t.dim() != len(shape) or any(want is not None and want != got for want, got in zip(shape, t.shape)):
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise ValueError(f"{name} must have shape {want} (got {list(t.shape)})")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (got strides {t.stride()})")
    return t


_error_counters: dict = {}


def error_counter(device: torch.device) -> torch.Tensor:
    """The library's default device-side error counter for `device` (one int32, used as uint32)."""
    counter = _error_counters.get(device)
    if counter is None:
        counter = torch.zeros(1, dtype=_int32, device=device)
        _error_counters[device] = counter
    return counter


def error_count(device="cpu") -> int:
    """Records and slots skipped as out of range on `device` since the last reset (synchronizes)."""
    return int(error_counter(resolve_device(device)).item()) & 0xFFFFFFFF


def reset_error_count(device="cpu") -> None:
    """Zeroes the default error counter of `device` (in stream order)."""
    error_counter(resolve_device(device)).zero_()
