"""What the op modules share: the binding of the compiled call path (pydsa/_read.pyx, the shared
reader and launch table; pydsa/_fill_*.pyx, one filler per op family) and prepared calls.

A call goes once to its compiled filler with its arguments as given: the filler reads and judges
every argument (a wrong one raises the error naming it, with nothing written or launched), fills the
params and launches them."""
from __future__ import annotations

import ctypes as C

import numpy as np
import torch

import pyplan

from . import _read, _tensors
from ._abi import PDL_DEFAULT, check as check_status, lib



def _entry(symbol: str) -> int:
    """The address of an entry point (op(params, stream) -> status), callable through ctypes too."""
    fn = getattr(lib, symbol)
    fn.restype, fn.argtypes = C.c_int, [C.c_void_p, C.c_void_p]
    return C.cast(fn, C.c_void_p).value


_read.init(tensor_type=torch.Tensor,
           dtypes=dict(float32=torch.float32, bfloat16=torch.bfloat16, int32=torch.int32, int64=torch.int64,
                       uint8=torch.uint8),
           raw_stream=getattr(torch._C, "_cuda_getCurrentRawStream", None), resolve=_entry,
           struct_size=lib.dsa_struct_size, messages=_tensors, ndarray_type=np.ndarray,
           record_lists=pyplan.record_lists, pdl_default=PDL_DEFAULT, status_error=check_status)
SIZES = _read.SIZES
"""Bytes of each op's params, by op name (the op table's, as the fillers declared them)."""
OPS = _read.OPS
_launch = _read.launch_prepared


class Prepared:
    """A validated call: params filled once by the op's compiled call (its `into=` form); launch() runs
    them again. A subclass names its op (`_op`, a row of the op table) and its compiled call (`_fill`)."""

    _op = None  # an op name of the op table (_read.OPS)
    _fill = None  # staticmethod(the op's compiled call), which fills instead of launching when given `into`

    def _bind(self, *args, **kwargs) -> None:
        """Fills the params through the op's compiled call with `into` set: it judges every argument (a wrong
        one raises, naming it) and returns (device, the buffers the params point into besides the arguments)."""
        self._buf = C.create_string_buffer(SIZES[self._op])
        self._address = C.addressof(self._buf)
        self._opid = OPS[self._op]
        self._dev, views = self._fill(*args, into=self._address, **kwargs)
        self._keep = (args, kwargs, views)
        self.device = torch.device("cpu") if self._dev < 0 else torch.device("cuda", self._dev)

    def launch(self, stream=None) -> None:
        """Runs the prepared call on `stream` (raw handle) or the current stream."""
        status = _launch(self._opid, self._address, self._dev, stream)
        if status:
            check_status(status)
