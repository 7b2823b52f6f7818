"""Whether the local TF servers can get a network namespace of their own here (tag_core/runtime/loopback.py):
found once per test process."""

from __future__ import annotations

import os

from tag_core.runtime import loopback


def _private_network_namespaces() -> bool:
    try:
        with loopback.loopback_namespace() as held:
            return held is not None
    except (loopback.NamespaceRefused, OSError):
        return False


NAMESPACES = os.environ.get(loopback.POLICY_ENV, "require") != "off" and _private_network_namespaces()
