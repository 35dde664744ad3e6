"""HeteroTrain worker: heterogeneous data-parallel training.

The user-facing :class:`hetero_worker.trainer.Trainer` at the top, over ``runtime`` (launch,
rendezvous, preflight, shutdown, simulated devices), ``comm`` (groups, communicator plan, weighted
sync, collectives), ``speed`` (rebalancing, stealing, codecs, the measured hierarchy), ``memory``
(caps, micro-batches, Group and Full sharding) and ``ckpt`` (checkpoints and resume).  Imports
only :mod:`heterotrain_common` of the project; importing this package does not import torch.
"""

__version__ = "0.1.0"
