"""Reading the contract's variables: :class:`ContractError` and the typed readers.

Two kinds: the ``parse_*`` functions turn one variable's non-empty text into its value (the
contract's table, :mod:`heterotrain_common.contract`, names one per variable); ``int_var``,
``seconds_from_env`` and ``required`` read a name from a mapping (unset or empty:
the default, or an error naming it).  Every error is a :class:`ContractError` naming the variable.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

from heterotrain_common.envnames import COMPRESSIONS, MAX_PROFILE_STEPS


class ContractError(ValueError):
    """An environment variable of the contract is missing, malformed or inconsistent.

    Attributes:
        variable: the offending variable's name, e.g. ``"HTJ_TOPOLOGY"``.
    """

    def __init__(self, variable: str, message: str) -> None:
        super().__init__(f"{variable}: {message}")
        self.variable = variable


def parse_int(text: str, name: str, *, minimum: int, maximum: int | None = None) -> int:
    """A whole number in ``minimum..maximum`` (no upper bound when ``maximum`` is None).

    Raises:
        ContractError: not an integer, or out of range.
    """
    try:
        value = int(text)
    except ValueError:
        raise ContractError(name, f"must be an integer, got {text!r}") from None
    if value < minimum or (maximum is not None and value > maximum):
        bound = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"
        raise ContractError(name, f"must be {bound}, got {value}")
    return value


def parse_seconds(text: str, name: str, *, allow_zero: bool) -> float:
    """A duration in seconds, >= 0 (``allow_zero``) or > 0.

    Raises:
        ContractError: not a number, NaN, negative, or zero when ``allow_zero`` is False.
    """
    try:
        value = float(text)
    except ValueError:
        raise ContractError(name, f"must be a number of seconds, got {text!r}") from None
    if value < 0 or (value == 0 and not allow_zero) or not math.isfinite(value):
        raise ContractError(name, f"must be {'>= 0' if allow_zero else '> 0'} and finite, got {value}")
    return value


def parse_choice(text: str, name: str, choices: tuple[str, ...]) -> str:
    """``text`` itself, which must be one of ``choices``.

    Raises:
        ContractError: not one of ``choices``.
    """
    if text not in choices:
        raise ContractError(name, f"must be one of {', '.join(choices)}; got {text!r}")
    return text


def parse_compression(text: str, name: str) -> str:
    """The compression mode in lower case (the spec's spelling ``Int8`` is accepted).

    Raises:
        ContractError: not one of :data:`COMPRESSIONS` in any case.
    """
    if text.lower() not in COMPRESSIONS:
        raise ContractError(name, f"must be one of {', '.join(COMPRESSIONS)}; got {text!r}")
    return text.lower()


def parse_flag(text: str, name: str) -> bool:
    """``"1"`` -> True, ``"0"`` -> False.

    Raises:
        ContractError: anything else.
    """
    if text not in ("0", "1"):
        raise ContractError(name, f"must be 0 or 1, got {text!r}")
    return text == "1"


def parse_rate(text: str, name: str) -> float:
    """A finite rate >= 0 (e.g. samples/s).

    Raises:
        ContractError: not a number, negative or infinite.
    """
    try:
        value = float(text)
    except ValueError:
        raise ContractError(name, f"must be a number of samples/s, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise ContractError(name, f"must be a finite number >= 0, got {value}")
    return value


def parse_shard_ppm(text: str, name: str) -> tuple[int, ...]:
    """Comma-separated shares in parts per million, ``"500000,500000"`` -> ``(500000, 500000)``;
    blank -> ``()`` (even shares).

    Raises:
        ContractError: an entry is not an integer >= 0, or they do not sum to 1 000 000.
    """
    text = text.strip()
    if not text:
        return ()
    parts = text.split(",")
    if not all(p.strip().isdigit() for p in parts):
        raise ContractError(name, f"must be integers >= 0 separated by commas, got {text!r}")
    shares = tuple(int(p) for p in parts)
    if sum(shares) != 10**6:
        raise ContractError(name, f"must sum to 1000000 (parts per million), got {sum(shares)}")
    return shares


def parse_step_range(text: str, name: str) -> tuple[int, int] | None:
    """``"20-25"`` -> ``(20, 25)``, ``"20"`` -> ``(20, 20)``, ``""`` -> None (shared by the CLI
    flag, the job annotation and the environment variable).

    Raises:
        ContractError: malformed, ``first < 1``, ``last < first`` or more than
            :data:`MAX_PROFILE_STEPS` steps (``name`` is reported as the variable).
    """
    text = text.strip()
    if not text:
        return None
    first_s, sep, last_s = text.partition("-")
    try:
        first, last = int(first_s), int(last_s) if sep else int(first_s)
    except ValueError:
        raise ContractError(name, f"must be steps like \"20-25\" or \"20\", got {text!r}") from None
    if first < 1 or last < first:
        raise ContractError(name, f"must be FIRST-LAST with 1 <= FIRST <= LAST, got {text!r}")
    if last - first + 1 > MAX_PROFILE_STEPS:
        raise ContractError(name, f"spans {last - first + 1} steps; at most {MAX_PROFILE_STEPS} "
                            "per trace")
    return first, last


def seconds_from_env(environ: Mapping[str, str], name: str, *, default_s: float,
                     allow_zero: bool) -> float:
    """A duration knob in seconds (``name`` unset or empty: ``default_s``).

    Raises:
        ContractError: set but not a number, or negative (or zero when ``allow_zero`` is False).
    """
    raw = environ.get(name, "")
    return default_s if raw == "" else parse_seconds(raw, name, allow_zero=allow_zero)


def required(environ: Mapping[str, str], name: str) -> str:
    """``environ[name]``.

    Raises:
        ContractError: unset or empty.
    """
    value = environ.get(name)
    if value is None or value == "":
        raise ContractError(name, "is required but not set (the operator or `heterotrain run` "
                            "sets it; see heterotrain_common.contract)")
    return value


def int_var(environ: Mapping[str, str], name: str, *, minimum: int, maximum: int | None = None,
            default: int | None = None) -> int:
    """A whole number from ``environ[name]`` (unset or empty: ``default``; required without one).

    Raises:
        ContractError: required but unset, not an integer, or out of range.
    """
    raw = environ.get(name, "")
    if raw == "" and default is not None:
        return default
    return parse_int(required(environ, name), name, minimum=minimum, maximum=maximum)


def load_json(name: str, text: str, kind: type) -> object:
    """``json.loads(text)``, which must be a ``kind`` (``dict`` or ``list``).

    Raises:
        ContractError: not valid JSON, or not a ``kind``.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ContractError(name, f"is not valid JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(data, kind):
        raise ContractError(name, f"must be a JSON {kind.__name__}")
    return data
