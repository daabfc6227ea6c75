"""What the op modules share: the binding of the compiled call path (pydsa/_read.pyx, the shared
reader, launch table and prepared calls; pydsa/_fill_*.pyx, one filler per op family) to torch and the library.

A call goes once to its compiled filler with its arguments as given: the filler reads and judges
every argument (a wrong one raises the error naming it, with nothing written or launched), fills the
params and launches them. A prepared form (C128Decode, C4Decode, ...) is a compiled class of its filler over
the reader's Prepared: its params filled once, launch() runs them again."""
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
"""Launches params at an address (op: a row of OPS): the library's status (MetadataCopy's launch)."""

