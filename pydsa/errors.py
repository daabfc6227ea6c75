"""pydsa's errors for a wrong argument: raised before anything is written or launched, carrying which argument,
what the call takes and what it was given, so a layer above (pydsa.sglang) can say it in its own callers' names.
The classes live in the planner's package (pyplan.errors), the lowest layer that raises them, so a planner
error is a pydsa.ArgumentError too.

`ArgumentTypeError` is a TypeError and `ArgumentValueError` a ValueError: code that catches those keeps working.
A status from the library itself is a `pydsa.DsaError`."""
from __future__ import annotations

from pyplan.errors import ArgumentError, ArgumentTypeError, ArgumentValueError

__all__ = ["ArgumentError", "ArgumentTypeError", "ArgumentValueError"]
