"""Node lists given as files (``heterotrain plan --nodes``): each node named once (pure).

The API server keeps Node names unique; a file need not.  A node listed twice would have its GPUs
counted twice and be over-committed by the plan (issue 32, F15), so it is refused naming both
entries.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hetero_operator.api.errors import SpecError


def check_node_names(nodes: Sequence[Mapping[str, Any]], source: str = "items") -> None:
    """Every node has a name, and no name is given twice.

    Args:
        nodes: Node objects (a NodeList's ``items``).
        source: how the list is named in messages (``"nodes.yaml: items"``).

    Raises:
        SpecError: ``<source>[i].metadata.name`` missing, or equal to an earlier node's.
    """
    first: dict[str, int] = {}
    for i, node in enumerate(nodes):
        meta = node.get("metadata") if isinstance(node, Mapping) else None
        name = meta.get("name") if isinstance(meta, Mapping) else None
        path = f"{source}[{i}].metadata.name"
        if not isinstance(name, str) or not name:
            raise SpecError(path, "is required: every Node needs its name")
        if name in first:
            raise SpecError(path, f"node {name!r} is listed twice ({source}[{first[name]}] and "
                            f"{source}[{i}]): its GPUs would be counted twice and the node "
                            "over-committed; keep one entry per node")
        first[name] = i
