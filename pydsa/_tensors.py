"""The messages of refused arguments and the per-device pieces every op needs (stream, error
counter). The compiled reader (pydsa/_read.pyx) judges each argument and, on the cold path, asks
`check` / `check_state` here for the error naming it (what was expected, what was given); `as_tensor`
is its DLPack view of an array that is not a torch tensor. Devices are C ABI ordinals: the CUDA index,
or DEVICE_HOST (-1) for CPU memory, which is what `Tensor.get_device()` returns.
"""
from __future__ import annotations

import torch

from ._abi import DEVICE_HOST
from .errors import ArgumentTypeError, ArgumentValueError

_int32 = torch.int32
_float32 = torch.float32
_Tensor = torch.Tensor
_current_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def device_name(dev: int) -> torch.device:
    return torch.device("cpu") if dev < 0 else torch.device("cuda", dev)


def device_index(t) -> int:
    """The C ABI's device field for a tensor: CUDA ordinal, or DEVICE_HOST for CPU memory."""
    if t.device.type == "cuda":
        return t.device.index
    if t.device.type == "cpu":
        return DEVICE_HOST
    raise ValueError(f"tensors must be on the CPU or a CUDA device (got {t.device})")


def resolve_device(device) -> torch.device:
    """torch.device(device), with a bare "cuda" pinned to the current CUDA device; a CUDA device on a
    machine without one is a ValueError saying so; an int is a CUDA ordinal."""
    if isinstance(device, int) and not isinstance(device, bool):
        device = f"cuda:{device}"
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"device must be 'cpu', 'cuda', 'cuda:N', an int N or a torch.device (got {device!r})") \
            from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device} was asked for but no CUDA device is available here "
                         f"(CPU tensors run the host backend)")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def launch_stream(stream, device: int) -> int:
    """The stream an op launches on: `stream` (a raw handle) when given, else the current one."""
    if stream is not None:
        return stream
    return 0 if device < 0 else _current_raw_stream(device)


def keep_for_stream(t: torch.Tensor, stream) -> None:
    """Rows a call made for itself and released after launching on `stream` (a raw handle, or None for the
    current stream): torch's allocator then hands them out again only after the work queued so far on that
    stream, as it does for tensors of the current stream."""
    if stream is not None and t.is_cuda:
        t.record_stream(torch.cuda.ExternalStream(stream, device=t.device))


# Arguments an op writes into: a read-only array there is refused (DLPack would hand it over writable).
_WRITTEN = frozenset(("out", "state", "states", "error_count", "load_indices", "cache", "vectors_out"))


def as_tensor(t, name: str) -> torch.Tensor:
    """t itself for a torch.Tensor; a zero-copy torch view of any other array that speaks DLPack
    (CuPy, JAX, numba, numpy); otherwise a TypeError naming the argument."""
    if isinstance(t, _Tensor):
        return t
    flags = getattr(t, "flags", None)
    if flags is not None and getattr(flags, "writeable", True) is False and name.split("[")[0] in _WRITTEN:
        raise ArgumentValueError(name, f"{name} is a read-only array, and the op writes into it")
    if hasattr(t, "__dlpack__"):
        try:
            return torch.from_dlpack(t)
        except Exception as exc:  # the producer's own refusal, reported under the argument's name
            raise ArgumentTypeError(name, f"{name} cannot be shared through DLPack: {exc}") from exc
    raise ArgumentTypeError(name, f"{name} must be a torch.Tensor or an array with __dlpack__ (got {type(t).__name__})")


def byte_buffer(n: int, device: torch.device) -> torch.Tensor:
    """An uninitialized uint8 [n] buffer on `device`."""
    return torch.empty(n, dtype=torch.uint8, device=device)


def real_pairs(t: torch.Tensor) -> torch.Tensor:
    """A complex tensor [..., n] as its real float pairs [..., 2n] (a view)."""
    return torch.view_as_real(t).flatten(-2)


def _shape_text(shape) -> str:
    return "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"


def check(t, name: str, dtype, shape: tuple, device: torch.device, rows: str | None = None) -> torch.Tensor:
    """Checks one tensor argument completely; `shape` entries of None match any size; `rows` says where the
    expected first size comes from. Returns the tensor (a torch view for a DLPack array)."""
    t = as_tensor(t, name)
    if t.dtype != dtype:
        raise ArgumentTypeError(name, f"{name} must have dtype {dtype} (got {t.dtype})")
    if t.device != device:
        raise ArgumentValueError(name, f"{name} is on {t.device} but the other tensors are on {device}")
    if t.dim() != len(shape) or any(want is not None and want != got for want, got in zip(shape, t.shape)):
        raise ArgumentValueError(name, f"{name} must have shape {_shape_text(shape)} (got {list(t.shape)}"
                                       f"{'; ' + rows if rows and t.dim() == len(shape) else ''})",
                                 expected=f"shape {_shape_text(shape)}", got=str(list(t.shape)))
    if not t.is_contiguous():
        raise ArgumentValueError(name, f"{name} must be contiguous (got strides {t.stride()})")
    return t


def check_state(state, name: str = "state") -> torch.Tensor:
    """Checks a state argument [S, 1, 3D], fp32 or bf16, D a positive multiple of 64, contiguous, on the
    CPU or a CUDA device: the state, or the error naming it."""
    state = as_tensor(state, name)
    if state.dtype not in (torch.float32, torch.bfloat16):
        raise ArgumentTypeError(name, f"{name} must have dtype torch.float32 or torch.bfloat16 (got {state.dtype})")
    if state.dim() != 3 or state.shape[1] != 1 or state.shape[2] % 3 != 0:
        raise ArgumentValueError(name, f"{name} must have shape [num_slots, 1, 3*D] (got {list(state.shape)})")
    d = state.shape[2] // 3
    if d <= 0 or d % 64 != 0:
        raise ValueError(f"head dim D = {name}.shape[2] / 3 = {d} must be a positive multiple of 64")
    if not state.is_contiguous():
        raise ArgumentValueError(name, f"{name} must be contiguous (got strides {state.stride()})")
    if state.device.type not in ("cpu", "cuda"):
        raise ValueError(f"tensors must be on the CPU or a CUDA device (got {state.device})")
    return state


def arg(t, name: str, dtype, dev: int, shape: tuple) -> torch.Tensor:
    """A contiguous tensor argument of `dtype` and exact `shape` (None: any size) on device `dev`,
    checked: the tensor (a torch view of a DLPack array), or the error naming it."""
    return check(t, name, dtype, shape, device_name(dev))


def ptr(t, name: str, dtype, dev: int, shape: tuple) -> int:
    """Data pointer of a contiguous tensor argument of `dtype` and exact `shape` on device `dev`."""
    try:
        if t.dtype is dtype and t.get_device() == dev and t.shape == shape and t.is_contiguous():
            return t.data_ptr()
    except AttributeError:
        pass
    return arg(t, name, dtype, dev, shape).data_ptr()


def optional_arg(t, name: str, dev: int, shape: tuple):
    """An optional int32 tensor argument (None stays None), checked like `arg`."""
    return None if t is None else arg(t, name, _int32, dev, shape)


def rows_arg(t, name: str, dtype, dev: int, width: int) -> tuple:
    """(tensor, rows) of a contiguous [rows, width] tensor argument on device `dev`, checked."""
    t = as_tensor(t, name)
    rows = t.shape[0] if t.dim() == 2 else None
    return arg(t, name, dtype, dev, (rows, width)), rows


def shaped_arg(t, name: str, dtype, dev: int, ndim) -> tuple:
    """(tensor, shape) of a contiguous tensor argument with `ndim` dimensions on device `dev`,
    checked; ndim None accepts any shape."""
    t = as_tensor(t, name)
    want = tuple(t.shape) if ndim is None or t.dim() == ndim else (None,) * ndim
    return arg(t, name, dtype, dev, want), t.shape


_error_counters: dict = {}


def error_counter(device) -> torch.Tensor:
    """The library's default device-side error counter for `device` (one int32, used as uint32)."""
    if isinstance(device, int):
        dev = device
    else:
        device = resolve_device(device)
        dev = DEVICE_HOST if device.type == "cpu" else device.index
    counter = _error_counters.get(dev)
    if counter is None:
        counter = torch.zeros(1, dtype=_int32, device=device_name(dev))
        _error_counters[dev] = counter
    return counter


def error_count(device="cpu") -> int:
    """Records and slots skipped as out of range on `device` since the last reset (synchronizes)."""
    return int(error_counter(resolve_device(device)).item()) & 0xFFFFFFFF


def reset_error_count(device="cpu") -> None:
    """Zeroes the default error counter of `device` (in stream order)."""
    error_counter(resolve_device(device)).zero_()
