"""Elastic membership (``spec.elastic``, issue 31): a lost rank shrinks the job instead of restarting it.

:class:`~hetero_worker.membership.elastic.Membership` is the Trainer's membership part: it joins
generation 0 through the supervisor's store, and when a step fails because a peer is gone it waits
for the supervisor's next generation (:mod:`heterotrain_common.membership`), re-forms the process
groups among the survivors, agrees on the state to go on from, re-splits the same global batch
over the survivors (:func:`heterotrain_common.split.split_batch`) and moves the data position to
the start of the interrupted step, so the loader's next batch is that step again
(:mod:`hetero_worker.membership.reform`). No checkpoint is read. See docs/elastic.md.
"""

from hetero_worker.membership.elastic import Membership, from_env, join_job

__all__ = ["Membership", "from_env", "join_job"]
