"""What a user's model file imports: `from tag_core.models import InputSpec, ModelSpec`.

A short, stable path for code outside this repository; the zoo and model references live in
`tag_core.capture.models`.
"""

from tag_core.capture.models.spec import InputSpec, ModelSpec

__all__ = ["InputSpec", "ModelSpec"]
