"""Per-op compute times, measured from TF's own traces.

In: a captured model (`tag_core.capture`) and batch sizes; or a CSV of profiles taken elsewhere.
Out: rows of (model, op, device_type, batch_size, run, time_us) in DuckDB's `op_profiles`,
device types named by the GPU catalog (`tag_core.cluster`); CSV export.
"""

from .csv_files import export_profiles, import_profiles, read_profile_csv
from .profiler import detect_device_type, initialise_randomly, profile_model, profile_step

__all__ = [
    "detect_device_type", "export_profiles", "import_profiles", "initialise_randomly", "profile_model",
    "profile_step", "read_profile_csv",
]
