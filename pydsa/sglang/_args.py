"""What pydsa.sglang's calls say of an argument their caller passed: one description, one reading of a count
and one translation of pydsa's argument errors into the caller's words, shared by the planners and compressors
(c4.py, compress.py) and the online and MTP calls (__init__.py)."""
from __future__ import annotations

import operator

import torch

from ..errors import ArgumentError


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


def caller_words(exc, names: dict):
    """A pydsa.ArgumentError in the caller's words, from the argument it carries (its message is not read), or
    exc itself when it is not one or names an argument the mapping does not know. names: pydsa's argument name
    -> the caller's, or -> (the caller's name, how the message says it). The class stays (a TypeError or
    ValueError). Cold path: called only from an except clause."""
    if not isinstance(exc, ArgumentError) or exc.argument not in names:
        return exc
    to = names[exc.argument]
    name, phrase = (to, to) if isinstance(to, str) else to
    renamed = exc.renamed(phrase)
    renamed.argument = name
    return renamed
