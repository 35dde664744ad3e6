"""The local floor: a real Kubernetes control plane on this machine (``heterotrain cluster up``).

``pki`` makes the certificates (``openssl`` CLI), ``controlplane`` starts and stops etcd,
kube-apiserver, kube-controller-manager and kube-scheduler, ``kueue`` installs and runs Kueue's
manager, ``kubelet`` registers Nodes and runs their pods as local processes, ``cluster_cli`` is
the ``heterotrain cluster`` subcommand.  See docs/cluster.md.
"""
