"""Dagster wiring for TAG: definitions, resources and partitions.

The assets themselves live in the top-level `assets` package (one module per
stage) and sensors/schedules in `sensors`; this package only assembles them.
"""
