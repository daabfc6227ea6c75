"""The errors for a wrong argument, shared by pyplan and pydsa (pydsa.errors re-exports them): raised before
anything is written or launched, carrying which argument, what the call takes and what it was given, so a layer
above (pydsa.sglang) can say it in its own callers' names.

`ArgumentTypeError` is a TypeError and `ArgumentValueError` a ValueError: code that catches those keeps working."""
from __future__ import annotations

__all__ = ["ArgumentError", "ArgumentTypeError", "ArgumentValueError"]


class ArgumentError(Exception):
    """A refused argument. `argument`: its name as the call spells it; `expected`: what the call takes;
    `got`: what was passed (text, or None where the message says it all). The message starts with the
    argument's name."""

    def __init__(self, argument: str, message: str, *, expected: str | None = None, got: str | None = None):
        if not message.startswith(argument):
            message = f"{argument}: {message}"
        super().__init__(message)
        self.argument, self.expected, self.got = argument, expected, got

    def renamed(self, name: str) -> "ArgumentError":
        """The same error, its argument called `name` (the caller's name for it)."""
        message = self.args[0]
        return type(self)(name, name + message[len(self.argument):], expected=self.expected, got=self.got)


class ArgumentTypeError(ArgumentError, TypeError):
    """An argument of the wrong kind: not a tensor, the wrong dtype, not a bool or an int."""


class ArgumentValueError(ArgumentError, ValueError):
    """An argument of the right kind with a wrong shape, device, size or value."""
