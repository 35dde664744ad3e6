"""Dataclass fields backed by environment variables: declared once, read and written by walking.

A field made with :func:`var` names its variable, how the variable's text is read and written,
the check of its value and its default; a field made with :func:`group` holds a nested dataclass
of such fields.  :func:`read_fields` builds a dataclass from an environment, :func:`write_fields`
renders one back and :func:`walk` lists the variables, all from the same declarations.  Both
env-backed records are declared this way: the contract (:mod:`heterotrain_common.contract`) and
the operator's settings (``hetero_operator.api.settingfields``, which adds its own error type,
overrides and checks after construction on top of :func:`variables`, :func:`env_text` and
:func:`walk`).  Pure Python.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from functools import partial
from typing import Any

from heterotrain_common.envread import parse_choice, parse_int, parse_seconds, required

_VAR = "heterotrain.var"
_GROUP = "heterotrain.group"
Reader = Callable[[str, str], Any]
"""``(text, name) -> value`` for a variable's non-empty text; raises
:class:`heterotrain_common.envread.ContractError` naming ``name``."""


@dataclass(frozen=True, slots=True)
class Var:
    """One variable: the metadata of the field that holds it.

    Attributes:
        name: the variable's name (:mod:`heterotrain_common.envnames`).
        read: its text -> value (:data:`Reader`).
        write: value -> text, the inverse of ``read``.
        also: further names rendered with the same text and never read
            (``TORCHELASTIC_RESTART_COUNT``).
        check: raises ``ValueError`` for a value out of range, applied by the record that owns
            the field (the operator's settings apply it to values set in code too); None for none.
        empty_is_value: an empty variable is a value (``HTJ_PEERING=""``: standalone) rather
            than unset.
    """

    name: str
    read: Reader
    write: Callable[[Any], str] = str
    also: tuple[str, ...] = ()
    check: Callable[[Any], None] | None = None
    empty_is_value: bool = False


def var(name: str, read: Reader, *, default: Any = MISSING,
        factory: Callable[[], Any] | None = None, write: Callable[[Any], str] = str,
        also: tuple[str, ...] = (), check: Callable[[Any], None] | None = None,
        empty_is_value: bool = False) -> Any:
    """A dataclass field holding variable ``name``: ``default`` (immutable: a number, a string,
    None, a tuple) or ``factory()``; with neither the variable is required."""
    meta = {_VAR: Var(name, read, write, also, check, empty_is_value)}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(metadata=meta) if default is MISSING else field(default=default, metadata=meta)


def group(cls: type) -> Any:
    """A dataclass field holding ``cls``, a dataclass of variables (defaulted when each of its
    fields has a default)."""
    if all(default_of(f) is not MISSING for f in fields(cls)):
        return field(default_factory=cls, metadata={_GROUP: cls})
    return field(metadata={_GROUP: cls})


def default_of(f: Field[Any]) -> Any:
    """Field ``f``'s default: its value, a fresh ``default_factory()``, or ``dataclasses.MISSING``
    when it has none."""
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return MISSING


def variables(cls: type) -> list[tuple[Field[Any], Var]]:
    """``(field, var)`` of the variable fields declared directly in dataclass ``cls`` (not in
    its groups), in declaration order."""
    return [(f, f.metadata[_VAR]) for f in fields(cls) if _VAR in f.metadata]


def env_text(environ: Mapping[str, str], v: Var) -> str | None:
    """``v``'s text in ``environ``, or None when unset (an empty variable is unset unless
    ``v.empty_is_value``)."""
    raw = environ.get(v.name)
    if raw is None or (raw == "" and not v.empty_is_value):
        return None
    return raw


def count(minimum: int, maximum: int | None = None) -> Reader:
    """A whole number in ``minimum..maximum`` (no upper bound when ``maximum`` is None)."""
    return partial(parse_int, minimum=minimum, maximum=maximum)


def one_of(choices: tuple[str, ...]) -> Reader:
    """The text itself, which must be one of ``choices``."""
    return partial(parse_choice, choices=choices)


def text(value: str, name: str) -> str:
    """The text as it is."""
    return value


positive_s: Reader = partial(parse_seconds, allow_zero=False)
"""Seconds > 0."""
non_negative_s: Reader = partial(parse_seconds, allow_zero=True)
"""Seconds >= 0."""


def short_float(value: float) -> str:
    """``1800.0`` -> ``"1800"``, ``2.5`` -> ``"2.5"`` (``%g``)."""
    return f"{value:g}"


def walk(cls: type, prefix: str = "") -> list[tuple[str, Var, Any]]:
    """``(path, var, default)`` of every variable under dataclass ``cls``, in declaration order:
    ``path`` is the attribute path such as ``"checkpoint.interval_steps"``, ``default`` is
    ``dataclasses.MISSING`` for a required variable and a factory's result for one made by a
    factory."""
    found: list[tuple[str, Var, Any]] = []
    for f in fields(cls):
        if _GROUP in f.metadata:
            found.extend(walk(f.metadata[_GROUP], f"{prefix}{f.name}."))
        elif _VAR in f.metadata:
            found.append((prefix + f.name, f.metadata[_VAR], default_of(f)))
    return found


def read_value(environ: Mapping[str, str], v: Var, default: Any) -> Any:
    """``v``'s value from ``environ`` (unset, see :func:`env_text`: ``default``).

    Raises:
        ContractError: malformed, or unset while ``default`` is ``dataclasses.MISSING``.
    """
    raw = env_text(environ, v)
    if raw is None:
        return required(environ, v.name) if default is MISSING else default
    return v.read(raw, v.name)


def read_fields(cls: type, environ: Mapping[str, str]) -> Any:
    """An instance of dataclass ``cls`` with every variable field read from ``environ``, in
    declaration order (other fields keep their defaults).

    Raises:
        ContractError: naming the first malformed or missing variable.
    """
    values: dict[str, Any] = {}
    for f in fields(cls):
        if _GROUP in f.metadata:
            values[f.name] = read_fields(f.metadata[_GROUP], environ)
        elif _VAR in f.metadata:
            values[f.name] = read_value(environ, f.metadata[_VAR], default_of(f))
    return cls(**values)


def write_fields(obj: Any, env: dict[str, str], *, always: Collection[str]) -> None:
    """Render the variable fields of dataclass ``obj`` into ``env``: those that differ from
    their defaults, and those named in ``always`` in any case."""
    for f in fields(obj):
        value = getattr(obj, f.name)
        if _GROUP in f.metadata:
            write_fields(value, env, always=always)
        elif _VAR in f.metadata:
            v = f.metadata[_VAR]
            if v.name in always or value != default_of(f):
                env.update(dict.fromkeys((v.name, *v.also), v.write(value)))
