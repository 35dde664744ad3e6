"""HeteroTrain operator: GPU inventory, placement planning, pod rendering, the kopf controller,
``heterotrain run`` and the dev cluster, in floors that import only downwards
(docs/architecture.md):

``api`` < ``cluster`` < ``planning`` < ``render`` < ``lifecycle`` <
{``controller``, ``local``, ``devcluster``} < ``cli``.

Everything below ``controller`` is pure (dicts and dataclasses in and out) and never imports kopf
or a Kubernetes client; ``controller`` is the kopf adapter, ``local`` runs jobs on this machine,
``devcluster`` runs a real Kubernetes control plane on it, and :mod:`hetero_operator.cli` (the
``heterotrain`` command) is the face above them and the worker's launcher, reaching each by module
name.  What the operator shares with the worker lives in :mod:`heterotrain_common`.
"""

__version__ = "0.1.0"
