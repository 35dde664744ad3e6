"""What the operator and the worker share: the env contract (names, readers, the parsed contract),
topology, link cost, run directories, process supervision and NVML.

Imports nothing else of the project and neither torch nor kopf, so both images can use it.
"""
