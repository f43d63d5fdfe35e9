"""The contract every Baton daemon and tool reads: names, what a pod asks, annotations, the API.

This package is the ground floor: it imports nothing else of Baton. `names` holds every resource
name, annotation key, env var, path and port; `kube` the API client helpers.
"""
