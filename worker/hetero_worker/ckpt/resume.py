"""What a :class:`~hetero_worker.trainer.Trainer`'s checkpoint carries besides model and optimizer,
under the same or a new plan: the plan (:func:`plan_of`), the codec states (:class:`CodecStates`)
and the rule that restores or resets them (:func:`restore_compression`). The checkpoint manager,
:class:`hetero_worker.ckpt.trainer_state.Checkpointing`, saves and restores them.

What the trainer's checkpoints carry besides model and optimizer (:mod:`hetero_worker.ckpt.checkpoint`
writes and agrees on the file):

* the plan it was taken under (:func:`plan_of`): world size, the planned split, device per rank,
  the current (maybe rebalanced) split, the hierarchy layout and the compression settings;
* per rank: RNG states and the compression codecs' error feedback (int8 error buffers, PowerSGD
  errors, ``Q`` factors and iteration counter), one entry per DDP bucket;
* ``extra["tracked"]``: the state of what ``Trainer.track`` registered (an LR scheduler, a
  counter), rank 0's, restored on every rank (:mod:`hetero_worker.ckpt.tracked`).

On resume (:meth:`hetero_worker.ckpt.trainer_state.Checkpointing.resume_from`):

* **same plan** (same world size, planned split and devices): the saved split, every rank's RNG
  and, when the layout and compression settings are also the same, every leader's codec state are
  restored: the run continues as if never interrupted (bit-identical on CPU);
* **new plan** (a re-plan onto other capacity: another world size or split): the contract's split
  is used, the data continue from the job's global position (exact epoch coverage), every rank
  gets fresh RNG, and the compression state is discarded with a ``compression_state_reset`` line
  (its tensors belong to the old leaders' group).

Under ``Group`` sharding no rank holds the whole model: model and optimizer state are saved
sharded with ``torch.distributed.checkpoint`` and resharded onto the resuming plan's groups
(:mod:`hetero_worker.ckpt.sharded`); everything above holds the same way.

Codec state is restored into the reducer's codecs, which are handed the live leaders' process group
on every call: a process group is never serialised, so it can never come back as the default
(world) group (case 37; pytorch/pytorch#79334 drops the group on pickling and substitutes the
default one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hetero_worker.comm.sync import WeightedGradSync
from hetero_worker.runtime.ranklog import log
from hetero_worker.speed.codecs import make_codec
from heterotrain_common.contract import Contract

__all__ = ["CodecStates", "plan_of", "restore_compression"]


class CodecStates:
    """The compression codecs' states of one rank, as a ``Stateful`` part: ``state_dict`` by DDP
    bucket (``str(bucket index)``; empty for non-leaders and without a codec reducer),
    ``load_state_dict`` builds the reducer's codecs from them.

    Args:
        sync: the gradient sync; its ``reducer`` (a
            :class:`hetero_worker.speed.controller.CodecReducer`, installed by the speed features)
            holds the codecs.
    """

    def __init__(self, sync: WeightedGradSync) -> None:
        self.sync = sync

    @property
    def reducer(self) -> Any:
        """The installed codec reducer, or None."""
        reducer = getattr(self.sync, "reducer", None)
        return reducer if reducer is not None and hasattr(reducer, "codecs") else None

    def settings(self) -> dict[str, Any] | None:
        """The codec settings a plan records (``mode``, ``powersgd_rank``,
        ``powersgd_start_iter``), or None without a codec reducer."""
        reducer = self.reducer
        if reducer is None:
            return None
        config = reducer.compression
        return {"mode": config.mode, "powersgd_rank": config.powersgd_rank,
                "powersgd_start_iter": getattr(config, "powersgd_start_iter", 0)}

    def state_dict(self) -> dict[str, Any]:
        """This rank's codec states by DDP bucket; empty for non-leaders."""
        reducer = self.reducer
        if reducer is None:
            return {}
        return {str(key): codec.state_dict() for key, codec in sorted(reducer.codecs.items())
                if hasattr(codec, "state_dict")}

    def load_state_dict(self, states: Mapping[str, Any]) -> int:
        """Build the reducer's codecs from saved states (before the first step); returns how many.

        Codecs are made exactly as the reducer makes them (``make_codec(config, seed=bucket)``)
        and get the live leaders' group on every call.
        """
        reducer = self.reducer
        if reducer is None:
            return 0
        for key, state in states.items():
            codec = make_codec(reducer.compression, seed=int(key))
            codec.load_state_dict(state)  # type: ignore[attr-defined]
            reducer.codecs[int(key)] = codec
        return len(states)


def plan_of(contract: Contract, split: Sequence[int], layout: Any,
            compression: Mapping[str, Any] | None) -> dict[str, Any]:
    """The plan a trainer runs under, plain types only.

    Args:
        contract: the rank's contract (topology, planned split).
        split: the current (maybe rebalanced) split.
        layout: the hierarchy layout in use (``mode``, ``groups``, ``leaders``).
        compression: :meth:`CodecStates.settings`.

    Returns:
        ``world_size``, ``planned_split`` (the contract's), ``devices`` (GPU product per rank),
        ``split`` (current), ``layout`` (``mode``, ``groups``, ``leaders``), ``compression``
        (codec settings, or None without a codec reducer).
    """
    return {"world_size": len(contract.topology),
            "planned_split": [int(b) for b in contract.local_batches],
            "devices": [e.gpu_product for e in contract.topology],
            "split": [int(b) for b in split],
            "layout": {"mode": layout.mode, "groups": [list(g) for g in layout.groups],
                       "leaders": list(layout.leaders)},
            "compression": dict(compression) if compression is not None else None}


def restore_compression(codecs: CodecStates, rank: int, state: Mapping[str, Any],
                        current: Mapping[str, Any]) -> None:
    """Restore this rank's codec state when plan, layout and settings match; else say reset.

    Args:
        codecs: this rank's codec states.
        rank: this rank.
        state: the loaded checkpoint (``ranks``, ``layout``, ``compression``,
            ``resumed_same_plan``).
        current: the resuming plan (:func:`plan_of`).
    """
    if codecs.reducer is None:
        return
    ranks = state["ranks"]
    saved = ranks[rank].get("compression", {}) if (
        state["resumed_same_plan"] and rank < len(ranks)) else {}
    same = (state["resumed_same_plan"] and state.get("layout") == current["layout"]
            and state.get("compression") == current["compression"])
    if same:
        codecs.load_state_dict(saved)
        return
    had_state = any(r.get("compression") for r in ranks)  # some leader kept codec state
    if had_state and rank in current["layout"]["leaders"]:
        reason = ("plan changed" if not state["resumed_same_plan"] else
                  "layout changed" if state.get("layout") != current["layout"] else
                  "compression settings changed")
        log(f"compression_state_reset: {reason} (saved layout "
            f"{(state.get('layout') or {}).get('groups')}, now "
            f"{current['layout']['groups']}); error feedback and PowerSGD warm-up "
            "start again", rank=rank)
