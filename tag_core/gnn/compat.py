"""The one module through which TAG imports DGL (every other dgl user imports from here).

dgl 2.1.0 is the newest Linux wheel. On torch 2.13 its `import dgl` only works when
(1) torchdata 0.9.0 is installed (later releases dropped the datapipes dgl imports) and
(2) `dgl.graphbolt` is already in `sys.modules`: its native library is built for
torch <= 2.2.1 and fails to load. TAG does not use graphbolt, so an empty package
stands in for it. Heterographs, message passing and `edge_softmax` work unchanged.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
import types

GRAPHBOLT = "dgl.graphbolt"


def _stub_graphbolt() -> None:
    if GRAPHBOLT in sys.modules:
        return
    stub = types.ModuleType(GRAPHBOLT)
    stub.__path__ = []  # a package, so `from dgl.graphbolt import x` fails with ImportError, not TypeError
    stub.__spec__ = importlib.machinery.ModuleSpec(GRAPHBOLT, None, is_package=True)
    stub.__doc__ = "Stand-in installed by tag_core.gnn.compat: graphbolt's native part needs torch <= 2.2.1."
    sys.modules[GRAPHBOLT] = stub


def _import_dgl() -> types.ModuleType:
    # Without DGLBACKEND dgl prints a notice and writes ~/.dgl/config.json on first import.
    os.environ.setdefault("DGLBACKEND", "pytorch")
    _stub_graphbolt()
    try:
        import dgl as module
    except ImportError as exc:
        raise ImportError(
            f"cannot import dgl ({exc}); TAG's GNN needs dgl==2.1.0 with torchdata==0.9.0 "
            "(pip install -e . installs both)"
        ) from exc
    return module


dgl = _import_dgl()
fn = dgl.function
edge_softmax = dgl.nn.functional.edge_softmax
DGLGraph = dgl.DGLGraph

__all__ = ["dgl", "fn", "edge_softmax", "DGLGraph", "GRAPHBOLT"]
