"""``heterotrain status`` and ``heterotrain logs``: a job's state and a rank's log, for a local run
(its run directory, :mod:`hetero_operator.local.runview`) and for a job on a cluster (through the
API server, :mod:`.cluster`).  The floor above ``local`` and ``controller``, below the command line.
"""
