"""Reading the contract's variables: :class:`ContractError`, the typed readers, and the knobs read
on their own."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from heterotrain_common import defaults
from heterotrain_common.envnames import (ACTIVATION_CHECKPOINTING, COMPRESSION, COMPRESSIONS,
                                         MAX_PROFILE_STEPS, MEMORY_CAP_BYTES, MICRO_BATCH_SIZE,
                                         POWERSGD_RANK, PREDICTED_SAMPLES_PER_S, PROFILE_STEPS,
                                         REBALANCE_INTERVAL_STEPS, RENDEZVOUS_TIMEOUT_S, RUN_DIR,
                                         SHARD_PPM, SHARDING, SHARDINGS, SIM_DELAY_PER_SAMPLE_S)


class ContractError(ValueError):
    """An environment variable of the contract is missing, malformed or inconsistent.

    Attributes:
        variable: the offending variable's name, e.g. ``"HTJ_LOCAL_BATCH_SIZE"``.
    """

    def __init__(self, variable: str, message: str) -> None:
        super().__init__(f"{variable}: {message}")
        self.variable = variable


def memory_settings(environ: Mapping[str, str]) -> dict[str, Any]:
    """The memory model's variables as :class:`Contract` fields.

    Returns:
        ``{"sharding": "none|group|full", "micro_batch_size": int >= 0,
        "activation_checkpointing": bool, "memory_cap_bytes": int >= 0,
        "shard_ppm": tuple of int}``.

    Raises:
        ContractError: naming the variable (unknown sharding, not an integer, a flag not 0/1,
            shares that are not integers >= 0 summing to 1 000 000).
    """
    sharding = environ.get(SHARDING) or "none"
    if sharding not in SHARDINGS:
        raise ContractError(SHARDING, f"must be one of {', '.join(SHARDINGS)}; got {sharding!r}")
    flag = environ.get(ACTIVATION_CHECKPOINTING) or "0"
    if flag not in ("0", "1"):
        raise ContractError(ACTIVATION_CHECKPOINTING, f"must be 0 or 1, got {flag!r}")
    return {"sharding": sharding,
            "micro_batch_size": int_var(environ, MICRO_BATCH_SIZE, minimum=0, default=0),
            "activation_checkpointing": flag == "1",
            "memory_cap_bytes": int_var(environ, MEMORY_CAP_BYTES, minimum=0, default=0),
            "shard_ppm": shard_ppm(environ)}


def shard_ppm(environ: Mapping[str, str]) -> tuple[int, ...]:
    """``HTJ_SHARD_PPM`` as a tuple (unset or empty: ``()``, even shares).

    Raises:
        ContractError: an entry is not an integer >= 0, or they do not sum to 1 000 000.
    """
    text = (environ.get(SHARD_PPM) or "").strip()
    if not text:
        return ()
    parts = text.split(",")
    if not all(p.strip().isdigit() for p in parts):
        raise ContractError(SHARD_PPM, f"must be integers >= 0 separated by commas, got {text!r}")
    shares = tuple(int(p) for p in parts)
    if sum(shares) != 10**6:
        raise ContractError(SHARD_PPM, f"must sum to 1000000 (parts per million), got {sum(shares)}")
    return shares


def rebalance_interval_steps(environ: Mapping[str, str]) -> int:
    """``HTJ_REBALANCE_INTERVAL_STEPS`` (unset or empty: 0 = static split).

    Raises:
        ContractError: not an integer >= 0.
    """
    return int_var(environ, REBALANCE_INTERVAL_STEPS, minimum=0, default=defaults.REBALANCE_INTERVAL_STEPS)


def compression_mode(environ: Mapping[str, str]) -> str:
    """``HTJ_COMPRESSION`` in lower case (the spec's spelling ``Int8`` is accepted; unset: none).

    Raises:
        ContractError: not one of :data:`COMPRESSIONS`.
    """
    mode = (environ.get(COMPRESSION) or "none").lower()
    if mode not in COMPRESSIONS:
        raise ContractError(COMPRESSION, f"must be one of {', '.join(COMPRESSIONS)}; "
                            f"got {environ.get(COMPRESSION)!r}")
    return mode


def powersgd_rank(environ: Mapping[str, str]) -> int:
    """``HTJ_POWERSGD_RANK`` (default :data:`heterotrain_common.defaults.POWERSGD_RANK`).

    Raises:
        ContractError: not an integer in 1..64.
    """
    return int_var(environ, POWERSGD_RANK, minimum=1, maximum=64, default=defaults.POWERSGD_RANK)


def sim_delay_per_sample_s(environ: Mapping[str, str]) -> float:
    """``HTJ_SIM_DELAY_PER_SAMPLE_S`` in seconds (default :data:`defaults.SIM_DELAY_PER_SAMPLE_S`).

    Raises:
        ContractError: set but not a number >= 0.
    """
    return seconds_from_env(environ, SIM_DELAY_PER_SAMPLE_S,
                            default_s=defaults.SIM_DELAY_PER_SAMPLE_S, allow_zero=True)


def rendezvous_timeout_s(environ: Mapping[str, str]) -> float:
    """``HTJ_RENDEZVOUS_TIMEOUT_S`` in seconds (default :data:`defaults.RENDEZVOUS_TIMEOUT_S`).

    Raises:
        ContractError: set but not a number > 0.
    """
    return seconds_from_env(environ, RENDEZVOUS_TIMEOUT_S,
                            default_s=defaults.RENDEZVOUS_TIMEOUT_S, allow_zero=False)


def predicted_samples_per_s(environ: Mapping[str, str]) -> float:
    """``HTJ_PREDICTED_SAMPLES_PER_S`` (unset or empty: 0 = no prediction).

    Raises:
        ContractError: not a finite number >= 0.
    """
    raw = environ.get(PREDICTED_SAMPLES_PER_S, "")
    if raw == "":
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        raise ContractError(PREDICTED_SAMPLES_PER_S,
                            f"must be a number of samples/s, got {raw!r}") from None
    if not 0 <= value < float("inf"):
        raise ContractError(PREDICTED_SAMPLES_PER_S, f"must be a finite number >= 0, got {value}")
    return value


def run_dir(environ: Mapping[str, str]) -> str:
    """``HTJ_RUN_DIR``, ``""`` when unset (a pod)."""
    return environ.get(RUN_DIR, "")


def profile_steps(environ: Mapping[str, str]) -> tuple[int, int] | None:
    """``HTJ_PROFILE_STEPS`` as ``(first, last)``, inclusive and 1-based; None when unset or empty.

    Raises:
        ContractError: not ``N`` or ``N-M`` with ``1 <= N <= M`` and at most
            :data:`MAX_PROFILE_STEPS` steps.
    """
    return parse_step_range(environ.get(PROFILE_STEPS, ""), PROFILE_STEPS)


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
    if raw == "":
        return default_s
    try:
        value = float(raw)
    except ValueError:
        raise ContractError(name, f"must be a number of seconds, got {raw!r}") from None
    if value < 0 or (value == 0 and not allow_zero) or value != value:
        raise ContractError(name, f"must be {'>= 0' if allow_zero else '> 0'}, got {value}")
    return value


def required(environ: Mapping[str, str], name: str) -> str:
    value = environ.get(name)
    if value is None or value == "":
        raise ContractError(name, "is required but not set (the operator or `heterotrain run` "
                            "sets it; see heterotrain_common.contract)")
    return value


def int_var(environ: Mapping[str, str], name: str, *, minimum: int, maximum: int | None = None,
         default: int | None = None) -> int:
    raw = environ.get(name, "")
    if raw == "" and default is not None:
        return default
    raw = required(environ, name)
    try:
        value = int(raw)
    except ValueError:
        raise ContractError(name, f"must be an integer, got {raw!r}") from None
    if value < minimum or (maximum is not None and value > maximum):
        bound = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"
        raise ContractError(name, f"must be {bound}, got {value}")
    return value


def choice_var(environ: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    value = required(environ, name)
    if value not in choices:
        raise ContractError(name, f"must be one of {', '.join(choices)}; got {value!r}")
    return value


def load_json(name: str, text: str, kind: type) -> object:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ContractError(name, f"is not valid JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(data, kind):
        raise ContractError(name, f"must be a JSON {kind.__name__}")
    return data
