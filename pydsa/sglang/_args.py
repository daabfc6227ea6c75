"""What pydsa.sglang's calls say of an argument their caller passed: one description, one reading of a count
and one translation of pydsa's argument errors into the caller's words, shared by the planners and compressors
(c4.py, offline.py, compress.py) and the online and MTP calls (__init__.py); and the layer's one cache of objects
made from a step's buffers."""
from __future__ import annotations

import operator
from operator import is_

import torch

from ..errors import ArgumentError, ArgumentValueError


def of_kind(plan, online: bool):
    """plan, unless pydsa's planners made it for the other c128 path (its `online` tag; None on sglang's own plans,
    read as the call says): then the error naming plan."""
    if getattr(plan, "online", None) is (not online):
        made, reads = ("generate_online", "generate") if not online else ("generate", "generate_online")
        raise ArgumentValueError("plan", f"plan was made by {made} (the {'online' if not online else 'offline'} c128 "
                                         f"records); this {'offline' if not online else 'online'} compress reads the "
                                         f"records of {reads}")
    return plan


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


def memo(store: dict, key, make, limit: int, same=()):
    """The sglang layer's one cache of objects made from a step's buffers (sglang passes the same buffers
    every step): store[key]'s object if it was made from the tensors `same` (compared by identity; none:
    the key alone decides), else make()'s, kept. Past `limit` entries the store starts over."""
    hit = store.get(key)
    if hit is not None and all(map(is_, hit[1], same)):
        return hit[0]
    if len(store) >= limit:
        store.clear()
    value = make()
    store[key] = (value, tuple(same))
    return value
