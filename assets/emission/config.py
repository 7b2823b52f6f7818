"""The run configuration of `distributed_graph` and its check (one module that both import)."""

from dagster import Config
from pydantic import Field


class EmitConfig(Config):
    device_kind: str = Field(default="gpu", description="gpu (the real cluster) or cpu (logical CPU devices).")
    check_steps: int = Field(default=2, description="Steps the check runs on local TF servers.")
    check_timeout_s: float = Field(default=600.0, description="Seconds the check may run.")
    check_rewrites: bool = Field(default=False, description="Grappler rewrites on in the check's session "
                                 "(off: it starts in a fraction of the time on big graphs; its step times do not count).")
    check_max_parameter_bytes: int = Field(default=64 * 2**20,
                                           description="Models with more parameters are not run here.")
    check_max_ops: int = Field(default=60_000, description="Emitted graphs with more ops are not run here.")
