"""What pydsa.sglang's calls say of an argument their caller passed: one description and one reading of a count,
shared by the planners (c4.py, compress.py) and the MTP calls (__init__.py)."""
from __future__ import annotations

import operator

import torch


def described(x) -> str:
    """What the caller passed, in its own terms: a tensor's dtype, shape and device, else its type."""
    if isinstance(x, torch.Tensor):
        return f"{str(x.dtype).replace('torch.', '')} {list(x.shape)} on {x.device}"
    module = type(x).__module__
    return type(x).__name__ if module == "builtins" else f"{module}.{type(x).__name__}"


def count_of(x):
    """x as an int when it is a count (a Python or numpy integer, a one-element integer tensor); None for anything
    else (a bool, a float, a string, None): never truncated."""
    if isinstance(x, bool):
        return None
    try:
        return operator.index(x)
    except TypeError:
        return None
