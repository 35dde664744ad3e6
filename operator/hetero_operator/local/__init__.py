"""The embedded run: ``heterotrain run`` and ``heterotrain plan`` without a cluster.

``run`` plans with the operator's planner and starts the ranks as local processes, ``supervise``
watches them (restarts by the one restart policy), ``report`` prints the final table, ``nodes``
reads this machine's GPUs, ``plan`` is the dry run, ``valueview`` the decision aid, ``rundirs`` and
``failure`` what a run leaves behind, ``invocation`` how the user typed the command.  The dev
control plane is a package of its own (:mod:`hetero_operator.devcluster`); the command line above
both is :mod:`hetero_operator.cli`.
"""
