"""Integer bounds of what TAG stores: DuckDB INTEGER columns (batch sizes, seeds, runs) and numpy int64 arrays."""

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
