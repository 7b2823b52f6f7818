"""Dagster wiring for TAG: definitions, resources (one set per environment, TAG_ENV) and partitions.

The assets themselves live in the top-level `assets` package (one folder per stage, its
assets and their checks) and sensors/schedules in `sensors`; this package only assembles them.
"""
