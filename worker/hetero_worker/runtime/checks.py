"""Argument checks shared by the worker's floors: the one ``>= minimum`` refusal, whose message
names the argument, where its value comes from (when it comes from an env var) and the value given."""

from __future__ import annotations

__all__ = ["at_least"]


def at_least(value: int, minimum: int, name: str, *, source: str = "") -> int:
    """Return ``value`` when it is at least ``minimum``.

    Args:
        value: the number given.
        minimum: the smallest value allowed.
        name: the argument's name, first in the message.
        source: where the value comes from (e.g. the variable HTJ_CHECKPOINT_MAX_FAILURES), named in
            parentheses after the bound; empty: none.

    Raises:
        ValueError: ``"<name> must be >= <minimum> (<source>), got <value>"``.
    """
    if value < minimum:
        where = f" ({source})" if source else ""
        raise ValueError(f"{name} must be >= {minimum}{where}, got {value}")
    return value
