"""The dev cluster: a real Kubernetes control plane on this machine (``heterotrain cluster up``,
docs/cluster.md), a tool of its own beside the embedded run (:mod:`hetero_operator.local`); the two
import nothing of each other.

``pki`` makes the certificates (``openssl`` CLI), ``controlplane``/``cpflags`` start and stop etcd,
kube-apiserver, kube-controller-manager and kube-scheduler, ``kueue`` installs and runs Kueue's
manager, ``kubelet`` (with ``kubeapi`` and ``podenv``) registers Nodes and runs their pods as local
processes, ``cluster_cli`` is the ``heterotrain cluster`` subcommand.
"""
