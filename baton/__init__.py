"""Baton: turn-taking GPU sharing for training jobs on Kubernetes.

This package is the ground every part stands on: `contract` (what a Baton pod asks, the
annotations, the names, the DRA client) and `_pb` (the generated gRPC stubs). It imports
nothing else of Baton; `__main__` is the `baton` entry point into `commands`, the one arrow up.
"""

__version__ = "0.1.0"
