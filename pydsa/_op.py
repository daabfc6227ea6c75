"""What the op modules share: the binding of the compiled filler (pydsa/_calls.pyx, the one code
that fills every op's params), the state argument's check, the second try of a declined call, and
prepared calls.

A call first goes to the compiled filler with its arguments as given. When that declines (an
argument it cannot read, or one that is wrong), the op module's checks run: they raise the error
that names the argument, or return the arguments as torch tensors (zero-copy DLPack views of other
arrays, the default error counter made), which the filler then takes."""
from __future__ import annotations

import ctypes as C

import numpy as np
import torch

import pyplan

from . import _calls
from ._abi import check as check_status, lib
from ._tensors import as_tensor, error_counter, launch_stream, optional_arg

DECLINED = _calls.DECLINED

_calls.init(torch.Tensor, dict(float32=torch.float32, bfloat16=torch.bfloat16, int32=torch.int32, int64=torch.int64,
                               uint8=torch.uint8),
            getattr(torch._C, "_cuda_getCurrentRawStream", None),
            *(C.cast(getattr(lib, name), C.c_void_p).value for name in (
                "dsa_c128_decode", "dsa_c128_prefill", "dsa_metadata_copy", "dsa_c128_upload_plan", "dsa_c128_verify",
                "dsa_c128_commit", "dsa_kv_store", "dsa_sglang_plan")),
            np.ndarray, pyplan.record_lists)
SIZES = _calls.struct_sizes()

_STATE_DTYPES = (torch.float32, torch.bfloat16)


def state_arg(state, name: str = "state") -> tuple:
    """(state tensor, device ordinal, slots, D) of a state argument [S, 1, 3D], fp32 or bf16, D a
    positive multiple of 64; otherwise an error naming it."""
    state = as_tensor(state, name)
    if state.dtype not in _STATE_DTYPES:
        raise TypeError(f"{name} must have dtype torch.float32 or torch.bfloat16 (got {state.dtype})")
    if state.dim() != 3 or state.shape[1] != 1 or state.shape[2] % 3 != 0:
        raise ValueError(f"{name} must have shape [num_slots, 1, 3*D] (got {list(state.shape)})")
    d = state.shape[2] // 3
    if d <= 0 or d % 64 != 0:
        raise ValueError(f"head dim D = {name}.shape[2] / 3 = {d} must be a positive multiple of 64")
    if not state.is_contiguous():
        raise ValueError(f"{name} must be contiguous (got strides {state.stride()})")
    if state.device.type not in ("cpu", "cuda"):
        raise ValueError(f"tensors must be on the CPU or a CUDA device (got {state.device})")
    return state, state.get_device(), state.shape[0], d


def counter_arg(error_count, dev: int):
    """error_count checked (int32 [1] on `dev`), or None with the device's default counter made once."""
    if error_count is None:
        error_counter(dev)
        return None
    return optional_arg(error_count, "error_count", dev, (1,))


def _declined(name: str) -> RuntimeError:
    return RuntimeError(f"pydsa: the {name} params filler declined arguments that passed its checks "
                        f"(a bug in pydsa; please report it with the arguments' shapes and dtypes)")


def call_checked(fast, checked: dict, dev: int, stream, flags: int) -> None:
    """The second try of a one-shot call: checked arguments, the stream looked up here."""
    status = fast(stream=launch_stream(stream, dev), flags=flags, **checked)
    if status == DECLINED:
        raise _declined(fast.__name__)
    check_status(status)


class Prepared:
    """A validated call: params filled once by the compiled filler; launch() runs them again."""

    _op = None  # _calls.OP_*
    _struct = None  # dsa_struct_id of the params

    def _bind(self, fill, checker, args: dict, extra: dict) -> None:
        """Fills the params from `args` (as given; else as `checker(**args)` returns them, which
        raises the named error for a wrong one) and `extra` (flags and other non-tensor fields)."""
        self._buf = C.create_string_buffer(SIZES[self._struct])
        self._address = C.addressof(self._buf)
        filled = fill(self._address, **args, **extra)
        if not filled:
            args, dev = checker(**args)
            filled = fill(self._address, **args, **extra)
            if not filled:
                raise _declined(fill.__name__)
        self._keep = (args, filled)  # the buffers the params point into (a filler's own ones in `filled`)
        self._dev = C.c_int32.from_buffer(self._buf, 8).value  # every params struct: device at byte 8
        self.device = torch.device("cpu") if self._dev < 0 else torch.device("cuda", self._dev)

    def launch(self, stream=None) -> None:
        """Runs the prepared call on `stream` (raw handle) or the current stream."""
        status = _calls.launch(self._op, self._address, self._dev, stream)
        if status == DECLINED:  # the current stream could not be read there
            status = _calls.launch(self._op, self._address, self._dev, launch_stream(stream, self._dev))
        if status:
            check_status(status)
