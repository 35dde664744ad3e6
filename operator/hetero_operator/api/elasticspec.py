"""``spec.elastic``: a job that shrinks instead of restarting when it loses ranks (pure; issue 31).

    elastic:
      minRanks: 2     # below this many live ranks: today's gang restart from the last checkpoint
      maxRanks: 4     # the most ranks the job may run with (default spec.gpus.ranks)

Parsed here into :class:`ElasticSpec`; what the planner refuses with it (a Kueue queue, sharded
model state, pipeline stages) is :mod:`hetero_operator.planning.elasticplan`; ``heterotrain run``
supervises it (:mod:`hetero_operator.local.supervise`), the operator shrinks and grows it
(:mod:`hetero_operator.lifecycle.elastic`, the keeper pod :mod:`hetero_operator.render.keeper`)
and the worker re-forms (``hetero_worker.membership``). See docs/elastic.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hetero_operator.api.errors import SpecError
from hetero_operator.api.fields import integer
from hetero_operator.api.strictfields import nearest

FIELDS: tuple[str, ...] = ("maxRanks", "minRanks")
MAX_RANKS = 65536
"""The largest rank count a field may hold (as ``spec.gpus.ranks``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ElasticSpec:
    """A parsed ``spec.elastic``.

    Attributes:
        min_ranks: the fewest live ranks the job goes on with; one more loss falls back to the gang
            restart from the last checkpoint.
        max_ranks: the most ranks the job may run with: ``heterotrain run`` starts a lost rank
            again while the job has fewer, the operator creates a lost pod again once its node
            is healthy, and its ranks join the running job (docs/elastic.md).
    """

    min_ranks: int
    max_ranks: int


def parse_elastic(raw: Any, *, ranks: int, path: str = "spec.elastic") -> ElasticSpec | None:
    """``spec.elastic`` as an :class:`ElasticSpec` (None when absent: not elastic).

    Args:
        raw: the field's value.
        ranks: ``spec.gpus.ranks`` (the default ``maxRanks`` and the most ``minRanks`` may be).

    Raises:
        SpecError: naming the field and the fix (unknown field, a count out of range,
            ``minRanks`` above ``maxRanks`` or above ``spec.gpus.ranks``, ``maxRanks`` above
            ``spec.gpus.ranks``).
    """
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise SpecError(path, f"must be a mapping (minRanks, maxRanks), got {type(raw).__name__}; "
                              "e.g. elastic: {minRanks: 2}")
    for key in raw:
        if key not in FIELDS:
            hint = nearest(str(key), FIELDS)
            raise SpecError(f"{path}.{key}", "is no elastic field"
                            + (f": did you mean {hint}?" if hint else f" (known: {', '.join(FIELDS)})"))
    max_ranks = integer(raw, "maxRanks", f"{path}.maxRanks", ranks, 1, MAX_RANKS)
    min_ranks = integer(raw, "minRanks", f"{path}.minRanks", 1, 1, MAX_RANKS)
    if min_ranks > max_ranks:
        raise SpecError(f"{path}.minRanks", f"{min_ranks} is above {path}.maxRanks {max_ranks}: "
                        f"lower minRanks to {max_ranks} or less, or raise maxRanks")
    if min_ranks > ranks:
        raise SpecError(f"{path}.minRanks", f"{min_ranks} is above spec.gpus.ranks {ranks}: the job "
                        f"would start below its own minimum; lower minRanks to {ranks} or less")
    if max_ranks > ranks:
        raise SpecError(f"{path}.maxRanks", f"{max_ranks} is above spec.gpus.ranks {ranks}: a job "
                        "grows back to the ranks it was planned with (lost ranks rejoin), it does "
                        "not add ranks beyond them yet; lower maxRanks to "
                        f"{ranks} or less, or raise spec.gpus.ranks")
    return ElasticSpec(min_ranks=min_ranks, max_ranks=max_ranks)
