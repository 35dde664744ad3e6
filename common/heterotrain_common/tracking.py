"""The experiment-tracking settings of a job: ``spec.training.tracking`` in the manifest and
``HTJ_TRACKING`` (compact JSON) in the env contract; one parser for both (docs/tracking.md).

The normal form is a mapping with one entry per selected backend::

    {"tensorboard": {"logDir": ""},
     "wandb": {"project": "p", "mode": "offline", "secretRef": {"name": "s", "key": "WANDB_API_KEY"}},
     "mlflow": {"trackingUri": "file:/x", "experiment": "e", "secretRef": None}}

``logDir`` ``""`` means the default: ``<run dir>/tensorboard`` under ``heterotrain run``,
``<checkpoint path>/tensorboard/<job>`` in a pod. Torch-free; the worker's writers are
:mod:`hetero_worker.tracking`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from heterotrain_common.envread import ContractError

BACKENDS: tuple[str, ...] = ("tensorboard", "wandb", "mlflow")
"""Backends ``spec.training.tracking`` may name."""
WANDB_MODES: tuple[str, ...] = ("offline", "online", "disabled")
"""``spec.training.tracking.wandb.mode`` values (W&B's own ``mode``)."""
SECRET_KEYS = {"wandb": "WANDB_API_KEY", "mlflow": "MLFLOW_TRACKING_TOKEN"}
"""Default key of each backend's ``secretRef`` in its Kubernetes Secret (also the env name)."""
_FIELDS = {"tensorboard": ("logDir",), "wandb": ("project", "mode", "secretRef"),
           "mlflow": ("trackingUri", "experiment", "secretRef")}


class TrackingError(ValueError):
    """An invalid tracking setting.

    Attributes:
        path: the offending field, e.g. ``"spec.training.tracking.wandb.project"``.
    """

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


def parse_tracking(value: Any, path: str = "spec.training.tracking") -> dict[str, dict[str, Any]]:
    """The normal form of ``value`` (None or ``{}``: ``{}``, no tracking).

    Raises:
        TrackingError: naming the first invalid field under ``path`` and the fix.
    """
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TrackingError(path, "must be a mapping such as {tensorboard: {}}, got "
                                  f"{type(value).__name__}")
    out: dict[str, dict[str, Any]] = {}
    for name, body in value.items():
        p = f"{path}.{name}"
        if name not in BACKENDS:
            raise TrackingError(p, f"unknown backend; use one of {', '.join(BACKENDS)}")
        body = {} if body is None else body
        if not isinstance(body, Mapping):
            raise TrackingError(p, "must be a mapping ({} for the defaults)")
        unknown = [k for k in body if k not in _FIELDS[name]]
        if unknown:
            raise TrackingError(f"{p}.{unknown[0]}", "unknown field; known: "
                                + ", ".join(_FIELDS[name]))
        if name == "tensorboard":
            out[name] = {"logDir": _string(body, "logDir", p, required=False)}
        elif name == "wandb":
            mode = _string(body, "mode", p, required=False) or "offline"
            if mode not in WANDB_MODES:
                raise TrackingError(f"{p}.mode", f"{mode!r} is not one of {', '.join(WANDB_MODES)}")
            out[name] = {"project": _string(body, "project", p), "mode": mode,
                         "secretRef": _secret(body.get("secretRef"), f"{p}.secretRef", name)}
        else:
            out[name] = {"trackingUri": _string(body, "trackingUri", p),
                         "experiment": _string(body, "experiment", p),
                         "secretRef": _secret(body.get("secretRef"), f"{p}.secretRef", name)}
    return out


def _string(body: Mapping[str, Any], key: str, path: str, *, required: bool = True) -> str:
    raw = body.get(key)
    if raw is None or raw == "":
        if required:
            raise TrackingError(f"{path}.{key}", "is required (a non-empty string)")
        return ""
    if not isinstance(raw, str):
        raise TrackingError(f"{path}.{key}", f"must be a string, got {type(raw).__name__}")
    return raw


def _secret(raw: Any, path: str, backend: str) -> dict[str, str] | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or not isinstance(raw.get("name"), str) or not raw["name"]:
        raise TrackingError(path, "must be {name: SECRET, key: KEY} naming a Kubernetes Secret in "
                                  f"the job's namespace (key defaults to {SECRET_KEYS[backend]})")
    extra = [k for k in raw if k not in ("name", "key")]
    if extra:
        raise TrackingError(f"{path}.{extra[0]}", "unknown field; known: name, key")
    key = raw.get("key") or SECRET_KEYS[backend]
    if not isinstance(key, str):
        raise TrackingError(f"{path}.key", "must be a string")
    return {"name": raw["name"], "key": key}


def read_tracking(text: str, name: str) -> dict[str, dict[str, Any]]:
    """Contract reader of ``HTJ_TRACKING`` (``name``): JSON of the normal form.

    Raises:
        ContractError: not JSON, or an invalid setting (named).
    """
    try:
        return parse_tracking(json.loads(text), "tracking")
    except json.JSONDecodeError as exc:
        raise ContractError(name, f"is not JSON ({exc.msg} at {exc.pos})") from None
    except TrackingError as exc:
        raise ContractError(name, str(exc)) from None


def tracking_to_json(tracking: Mapping[str, Any]) -> str:
    """``HTJ_TRACKING``'s text: compact JSON with sorted keys."""
    return json.dumps(tracking, separators=(",", ":"), sort_keys=True)


def read_prices(text: str, name: str) -> dict[str, float | None]:
    """Contract reader of ``HTJ_PRICES_PER_HOUR`` (``name``): JSON mapping each GPU product to its
    price of one device per hour, a number >= 0 or null (unpriced).

    Raises:
        ContractError: not JSON, not a mapping, or a price that is neither null nor a number >= 0.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ContractError(name, f"is not JSON ({exc.msg} at {exc.pos})") from None
    if not isinstance(data, Mapping):
        raise ContractError(name, "must be a JSON object of GPU product to price per hour")
    out: dict[str, float | None] = {}
    for product, price in data.items():
        if price is not None and (isinstance(price, bool) or not isinstance(price, (int, float))
                                  or not price >= 0 or price == float("inf")):
            raise ContractError(name, f"{product}: a price must be null or a number >= 0, "
                                      f"got {price!r}")
        out[str(product)] = None if price is None else float(price)
    return out


def prices_to_json(prices: Mapping[str, float | None]) -> str:
    """``HTJ_PRICES_PER_HOUR``'s text: compact JSON with sorted keys (null for unpriced)."""
    return json.dumps(dict(prices), separators=(",", ":"), sort_keys=True)
