"""Baton: turn-taking GPU sharing for training jobs on Kubernetes."""

__version__ = "0.1.0"
