"""HeteroTrain operator: GPU inventory, placement planning, pod rendering, the kopf controller and
``heterotrain run``, in floors that import only downwards (docs/architecture.md):

``api`` < ``cluster`` < ``planning`` < ``render`` < ``lifecycle`` < {``controller``, ``local``}.

Everything below ``controller`` is pure (dicts and dataclasses in and out) and never imports kopf
or a Kubernetes client; ``controller`` is the kopf adapter, ``local`` runs jobs on this machine.
What the operator shares with the worker lives in :mod:`heterotrain_common`.
"""

__version__ = "0.1.0"
