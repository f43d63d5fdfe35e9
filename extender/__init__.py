"""The kube-scheduler extender: places tenant pods on GPUs and binds them."""
