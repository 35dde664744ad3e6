"""The local floor: what runs on this machine.

The command line and the embedded default (``cli``, ``run``, ``plan`` and their helpers:
``heterotrain run``/``plan`` without a cluster), and a real Kubernetes control plane
(``heterotrain cluster up``, docs/cluster.md): ``pki`` makes the certificates (``openssl`` CLI),
``controlplane``/``cpflags`` start and stop etcd, kube-apiserver, kube-controller-manager and
kube-scheduler, ``kueue`` installs and runs Kueue's manager, ``kubelet`` (with ``kubeapi`` and
``podenv``) registers Nodes and runs their pods as local processes, ``cluster_cli`` is the
``heterotrain cluster`` subcommand.
"""
