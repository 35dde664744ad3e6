"""Start-up check of the installed HeteroTrainingJob CRD (shared/cases/27).

Helm installs a chart's ``crds/`` once and never upgrades them (helm/helm#8163), and the API server
silently prunes fields its structural schema does not list.  An operator running against an older
CRD would see new spec fields vanish (a setting quietly ignored) and its status writes stripped.
So at start-up the operator reads the installed CRD and refuses to run when a field it relies on
is missing, naming the fields and the fix.

Pure: no kopf, no kubernetes (tests/operator/test_layering.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from hetero_operator.api.spec import API_GROUP, PLURAL, VERSION
from hetero_operator.api.strictfields import crd_schema

CRD_NAME = f"{PLURAL}.{API_GROUP}"

def required_fields() -> tuple[str, ...]:
    """Every field of the CRD this operator ships with: the spec fields it reads and the status
    fields it writes (``a[].b`` is field ``b`` of the items of list ``a``).

    The shipped CRD is the one :func:`hetero_operator.api.strictfields.crd_schema` finds (copied into
    the operator image next to the package; ``crds/`` in a checkout), so a field added to the CRD
    is checked without a second list.  Empty when no shipped CRD is found.
    """

    schema = crd_schema()
    if schema is None:
        return ()
    return tuple(sorted(_fields_of(schema)[0]))


class StaleCrdError(RuntimeError):
    """The installed CRD lacks fields this operator relies on (or is not installed).

    Attributes:
        missing: the missing field paths, sorted.
    """

    def __init__(self, message: str, missing: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.missing = missing


def schema_of(crd: Mapping[str, Any], version: str = VERSION) -> Mapping[str, Any] | None:
    """The ``openAPIV3Schema`` of a served ``version`` of ``crd``; None when not served."""
    for v in (crd.get("spec") or {}).get("versions") or ():
        if v.get("name") == version and v.get("served", True):
            return ((v.get("schema") or {}).get("openAPIV3Schema")) or {}
    return None


def _walk(node: Mapping[str, Any], prefix: str) -> Iterator[tuple[str, bool]]:
    """``(path, open)`` for every property under ``node``; an open one keeps unknown fields, so
    nothing below it is pruned (and it is not descended into)."""
    for key, child in (node.get("properties") or {}).items():
        path = f"{prefix}{key}"
        is_open = bool(child.get("x-kubernetes-preserve-unknown-fields"))
        yield path, is_open
        if is_open:
            continue
        yield from _walk(child, path + ".")
        items = child.get("items")
        if isinstance(items, Mapping):
            if items.get("x-kubernetes-preserve-unknown-fields"):
                yield path + "[]", True
            else:
                yield from _walk(items, path + "[].")


def schema_fields(crd: Mapping[str, Any], version: str = VERSION) -> tuple[set[str], list[str]]:
    """``(fields, open paths)`` of ``spec`` and ``status`` in ``crd``'s schema of ``version``.

    Raises:
        StaleCrdError: ``version`` is not served by ``crd``.
    """
    schema = schema_of(crd, version)
    if schema is None:
        raise StaleCrdError(f"the installed CRD {CRD_NAME} does not serve {version}; apply the "
                            f"chart's CRD ({apply_hint()})")
    return _fields_of(schema)


def _fields_of(schema: Mapping[str, Any]) -> tuple[set[str], list[str]]:
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return set(), ["spec", "status"]
    root = {"properties": {k: v for k, v in (schema.get("properties") or {}).items()
                           if k in ("spec", "status")}}
    fields, open_paths = set(), []
    for path, is_open in _walk(root, ""):
        if is_open:
            open_paths.append(path)
        if not path.endswith("[]"):
            fields.add(path)
    return fields, open_paths


def missing_fields(crd: Mapping[str, Any], required: tuple[str, ...] | None = None,
                   version: str = VERSION) -> tuple[str, ...]:
    """Fields of ``required`` (default :func:`required_fields`) that the API server would prune
    under ``crd``'s schema.

    A field below an ``x-kubernetes-preserve-unknown-fields`` object is kept, so it is not missing.

    Raises:
        StaleCrdError: ``version`` is not served by ``crd``.
    """
    present, open_paths = schema_fields(crd, version)
    required = required_fields() if required is None else required
    return tuple(p for p in required if p not in present
                 and not any(p.startswith(o + ".") or p.startswith(o + "[]") for o in open_paths))


def check_installed_crd(crd: Mapping[str, Any] | None, required: tuple[str, ...] | None = None) -> None:
    """Refuse to run against a missing or stale CRD.

    Args:
        crd: the installed ``CustomResourceDefinition`` (None when it is not installed).
        required: the fields to find (default :func:`required_fields`).

    Raises:
        StaleCrdError: naming every missing field and how to apply the current CRD.
    """
    if crd is None:
        raise StaleCrdError(f"the CRD {CRD_NAME} is not installed; {apply_hint()}")
    missing = missing_fields(crd, required)
    if missing:
        raise StaleCrdError(
            f"the installed CRD {CRD_NAME} lacks {len(missing)} field(s) this operator relies on: "
            f"{', '.join(missing)}; the API server would silently drop them from jobs and status. "
            f"Upgrade the CRD: {apply_hint()}", missing)


def apply_hint() -> str:
    """How to install or upgrade the CRD."""
    return ("kubectl apply --server-side --force-conflicts -f charts/heterotrain/crds/ (helm upgrade "
            "does this in its pre-upgrade hook unless crdUpgrade.enabled is false or hooks are skipped)")
