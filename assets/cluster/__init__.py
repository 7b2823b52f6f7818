"""The cluster: `cluster_topology`, each topology snapshot validated and recorded (retired when deleted), and
`calibration`, the runtime terms that plans on it apply."""

from .assets import cluster_topology
from .calibration import calibration

__all__ = ["calibration", "cluster_topology"]
