"""HeteroTrain operator: GPU inventory, placement planning, pod rendering and the kopf controller.

Pure modules (``spec``, ``inventory``, ``images``, ``speed``, ``batching``, ``planning``,
``envrender``, ``rendering``, ``conditions``) never import kopf or kubernetes; ``main`` and ``k8s``
are the thin adapter.
"""

__version__ = "0.1.0"
