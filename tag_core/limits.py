"""Limits: integer bounds of what TAG stores (DuckDB INTEGER columns: batch sizes, seeds, runs; numpy int64
arrays), and the time a model may take to load."""

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1

# Seconds each step of loading a model (importing its file, calling its function, building it, tracing a
# step) may take: `--timeout`, else $TAG_MODEL_TIMEOUT, else this. See tag_core/capture/time_limit.py.
MODEL_TIMEOUT_S = 600.0
