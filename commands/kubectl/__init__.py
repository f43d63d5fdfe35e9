"""`kubectl baton`: status, why and usage of Baton's GPUs, read through the API server only
(the user's kubeconfig and RBAC; agents and the extender through the pod and service proxy)."""
