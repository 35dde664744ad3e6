"""HeteroTrain worker: heterogeneous data-parallel training.

Importing this package does not import torch; ``hetero_worker.contract`` is torch-free and shared
with the operator.
"""

__version__ = "0.1.0"
