"""pydsa's errors for a wrong argument: raised before anything is written or launched, carrying which argument,
what the call takes and what it was given, so a layer above (pydsa.sglang) can say it in its own callers' names.
The classes live in the planner's package (pyplan.errors), the lowest layer that raises them, so a planner
error is a pydsa.ArgumentError too.

`ArgumentTypeError` is a TypeError and `ArgumentValueError` a ValueError: code that catches those keeps working.
A status from the library itself is a `pydsa.DsaError`."""
from __future__ import annotations

from pyplan.errors import ArgumentError, ArgumentTypeError, ArgumentValueError

__all__ = ["ArgumentError", "ArgumentTypeError", "ArgumentValueError", "int_argument", "bool_argument",
           "records_ahead_argument"]


def int_argument(x, name: str, low: int, high: int, what: str = "") -> int:
    """x when it is an int in low..high (numpy integers too; never a bool, a float or an int-like string,
    which would be converted silently); else the error naming `name`."""
    if isinstance(x, bool) or not (isinstance(x, int) or type(x).__module__ == "numpy" and hasattr(x, "__index__")):
        raise ArgumentTypeError(name, f"{name} must be an int{what} (got {type(x).__name__} {x!r})")
    if not low <= x <= high:
        raise ArgumentValueError(name, f"{name} is {x}; expected {low}..{high}{what}")
    return int(x)


def bool_argument(x, name: str) -> bool:
    """x when it is True or False (never a truthy int or string, which would be taken silently); else the error
    naming `name`."""
    if x is not True and x is not False:
        raise ArgumentTypeError(name, f"{name} must be a bool (got {x!r})")
    return x


def records_ahead_argument(records_ahead, records) -> bool:
    """The records_ahead promise of a call over records (docs/spec.md, conventions): a bool, and only with
    records= (it says the records were written before the launch ahead of the call began)."""
    if bool_argument(records_ahead, "records_ahead") and records is None:
        raise ArgumentValueError("records_ahead", "records_ahead=True needs records= (it says the records were "
                                                  "written before the launch ahead of this call began)")
    return records_ahead
