"""Settings declared once: each field of a settings group names its ``HTJ_*`` variable, the parser
of the variable's text, the check of its value and its default, in one :func:`setting` call
(pure; no kopf).

The declarations are the contract's (:mod:`heterotrain_common.envfields`: one
:class:`~heterotrain_common.envfields.Var` per field, one walker); this module adds what the
operator's settings need on top: one-argument parsers, overrides by field name,
:class:`~hetero_operator.api.errors.ConfigError` naming the variable and the field, and checks
after construction.  :func:`read_group` builds a group from an environment and :func:`env_table`
lists every variable of a settings class; a group's ``__post_init__`` runs :func:`check_group`,
so a value set in code is checked like one read from the environment.  Parsers and checks raise
``ValueError``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import MISSING, fields
from typing import Any, ClassVar

from hetero_operator.api.errors import ConfigError
from heterotrain_common import envfields
from heterotrain_common.envfields import Var


def setting(default: Any = MISSING, *, env: str, parse: Callable[[str], Any],
            check: Callable[[Any], None] | None = None, factory: Callable[[], Any] | None = None,
            empty_is_value: bool = False) -> Any:
    """A dataclass field holding variable ``env``: ``default`` (immutable) or ``factory()``.

    ``parse`` takes the variable's text and raises ``ValueError`` saying what is wrong;
    ``check`` raises ``ValueError`` for a value out of range (:func:`check_group`).
    """
    return envfields.var(env, _reader(parse), default=default, factory=factory, check=check,
                         empty_is_value=empty_is_value)


def _reader(parse: Callable[[str], Any]) -> envfields.Reader:
    """``parse(text)`` as an :data:`~heterotrain_common.envfields.Reader` ``(text, name)``."""
    def read(raw: str, name: str) -> Any:
        return parse(raw)
    return read


def seconds(default: float, *, env: str) -> Any:
    """A :func:`setting` of seconds > 0, finite."""
    return setting(default, env=env, parse=finite, check=positive_s)


def gbps(default: float, *, env: str) -> Any:
    """A :func:`setting` of Gbit/s > 0, finite."""
    return setting(default, env=env, parse=finite, check=positive_gbps)


class Group:
    """Base of a settings group (a frozen dataclass of :func:`setting` fields): its
    ``__post_init__`` runs every field's check (:func:`check_group`); ``PATH`` is the group's name
    in :class:`~hetero_operator.api.settings.OperatorConfig`, for the messages.  A group with
    checks across fields extends ``__post_init__`` and calls this one first (by name:
    zero-argument ``super()`` fails in a ``slots=True`` dataclass)."""

    __slots__ = ()
    PATH: ClassVar[str] = ""

    def __post_init__(self) -> None:
        check_group(self, self.PATH)


def declared(cls: type) -> list[tuple[str, Var]]:
    """``(field name, declaration)`` of every setting field of group ``cls``, in order."""
    return [(f.name, v) for f, v in envfields.variables(cls)]


def read_group(cls: type, environ: Mapping[str, str], overrides: Mapping[str, Any], *,
               path: str) -> Any:
    """Group ``cls`` with each field from ``overrides`` (by field name, values already typed),
    else its variable in ``environ`` (:func:`heterotrain_common.envfields.env_text`), else its
    default.

    Raises:
        ConfigError: ``HTJ_X='text' does not parse: why (path.field)``, or a check failed.
    """
    values: dict[str, Any] = {}
    for name, v in declared(cls):
        raw = envfields.env_text(environ, v)
        if raw is not None:
            try:
                values[name] = v.read(raw, v.name)
            except ValueError as exc:
                raise ConfigError(f"{v.name}={raw!r} does not parse: {exc} ({path}.{name})") from None
    values.update({k: val for k, val in overrides.items() if val is not None})
    unknown = set(values) - {f.name for f in fields(cls)}
    if unknown:
        raise ConfigError(f"{path} has no setting {', '.join(sorted(unknown))}")
    return cls(**values)


def check_group(group: Any, path: str) -> None:
    """Run every field's check of ``group`` (the group's ``__post_init__`` calls it).

    Raises:
        ConfigError: ``path.field (HTJ_X) must ...``.
    """
    for name, v in declared(type(group)):
        if v.check is not None:
            try:
                v.check(getattr(group, name))
            except ValueError as exc:
                raise ConfigError(f"{path}.{name} ({v.name}) {exc}") from None


def env_table(cls: type) -> list[tuple[str, str, Any]]:
    """``(variable, field path, default)`` of every setting under settings class ``cls`` (its
    groups declared with :func:`heterotrain_common.envfields.group`), in declaration order; a
    default made by a factory is shown as the factory's result."""
    return [(v.name, path, default) for path, v, default in envfields.walk(cls)]


# --- parsers: text -> value (ValueError says what is wrong) ---------------------------------------

def text(raw: str) -> str:
    """The text as it is."""
    return raw


def finite(raw: str) -> float:
    """A finite number (``inf`` and ``nan`` are refused: a timeout of ``inf`` would be accepted
    and then crash the first ``asyncio`` wait or date computation that uses it; issue 32, F15)."""
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("must be a number") from None
    if not math.isfinite(value):
        raise ValueError(f"must be a finite number, got {raw.strip()!r}")
    return value


def boolean(raw: str) -> bool:
    """``1/0``, ``true/false``, ``yes/no`` (any case)."""
    if raw.lower() not in ("1", "0", "true", "false", "yes", "no"):
        raise ValueError("use true or false")
    return raw.lower() in ("1", "true", "yes")


def comma_list(raw: str) -> tuple[str, ...]:
    """``"a, b"`` -> ``("a", "b")`` (empty entries dropped)."""
    return tuple(p.strip() for p in raw.split(",") if p.strip())


def word_list(raw: str) -> tuple[str, ...]:
    """``"a b  c"`` -> ``("a", "b", "c")``."""
    return tuple(p.strip() for p in raw.split(" ") if p.strip())


def labels(raw: str) -> dict[str, str]:
    """``"k=v,k2=v2"`` -> ``{"k": "v", "k2": "v2"}``."""
    pairs = [p.strip().split("=", 1) for p in raw.split(",") if p.strip()]
    if not pairs or any(len(p) != 2 or not p[0] for p in pairs):
        raise ValueError("use key=value[,key=value]")
    return {k.strip(): v.strip() for k, v in pairs}


def lowered(raw: str) -> str:
    """The text stripped and in lower case."""
    return raw.strip().lower()


# --- checks: value -> None or ValueError ----------------------------------------------------------

def port(value: int) -> None:
    """A TCP port, 0 = off."""
    if not 0 <= value <= 65535:
        raise ValueError(f"must be a TCP port in 1..65535 (0 turns it off), got {value}")


def required_port(value: int) -> None:
    """A TCP port, never 0."""
    if not 1 <= value <= 65535:
        raise ValueError(f"must be a TCP port in 1..65535, got {value}")


def positive_s(value: float) -> None:
    """Seconds > 0, finite."""
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"must be > 0 seconds and finite, got {value}")


def positive_gbps(value: float) -> None:
    """Gbit/s > 0, finite."""
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"must be > 0 Gbit/s and finite, got {value}")


def in_range(lo: int, hi: int) -> Callable[[int], None]:
    """A whole number in ``lo..hi``."""
    def check(value: int) -> None:
        if not lo <= value <= hi:
            raise ValueError(f"must be in {lo}..{hi}, got {value}")
    return check


def one_of(choices: tuple[str, ...]) -> Callable[[str], None]:
    """One of ``choices``."""
    def check(value: str) -> None:
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}, got {value!r}")
    return check


def not_empty(value: tuple[str, ...]) -> None:
    """At least one entry."""
    if not value:
        raise ValueError("must not be empty")
