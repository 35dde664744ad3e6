"""``heterotrain convert``: jobs of other frameworks (Kubeflow's PyTorchJob) as HeteroTrainingJobs.

A floor beside ``local`` and ``controller``: it reads :mod:`hetero_operator.api` only (the spec and
the pod template rules) and needs no cluster.
"""
