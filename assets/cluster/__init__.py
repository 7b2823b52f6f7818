"""The cluster: `cluster_topology`, each topology snapshot validated and recorded (retired when deleted)."""

from .assets import cluster_topology

__all__ = ["cluster_topology"]
