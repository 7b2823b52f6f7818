"""TAG: topology-aware deployment planning for TensorFlow training. No Dagster here."""

__version__ = "0.1.0"
