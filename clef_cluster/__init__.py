"""A real Kubernetes control plane on one machine, for the real-cluster tests and for people trying the chart.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler are the real components, built from their Go
modules; nodes and pods are simulated by kwok (fake GPU node pools, pods that become Running and Ready);
KServe's own controller reconciles InferenceServices in Standard (RawDeployment) mode. Everything listens on
127.0.0.1 on free ports. ``python -m clef_cluster build|up|down|env|status``.
"""
