"""tag_core.gnn.compat: dgl 2.1 imports on torch 2.13 through the graphbolt stand-in, and what TAG uses works."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tag_core.gnn import compat
from tag_core.gnn.compat import GRAPHBOLT, dgl, edge_softmax, fn


def test_graphbolt_is_the_stand_in_and_dgl_is_the_real_package():
    stub = sys.modules[GRAPHBOLT]
    assert "tag_core.gnn.compat" in stub.__doc__ and stub.__path__ == []
    assert dgl.__version__.startswith("2.1") and sys.modules["dgl"] is dgl
    import dgl as again  # a later plain import gets the same, already patched module

    assert again is dgl
    with pytest.raises(ImportError):
        from dgl.graphbolt import ItemSet  # noqa: F401  (nothing of graphbolt is pretended)


def test_stub_install_is_idempotent():
    before = sys.modules[GRAPHBOLT]
    compat._stub_graphbolt()
    assert sys.modules[GRAPHBOLT] is before


@pytest.mark.slow
def test_plain_import_dgl_without_the_stub_fails_in_a_fresh_process_and_works_with_it():
    """Documents why the module exists: the bare import breaks on this torch; through compat it works."""
    env_code = "import os; os.environ.setdefault('DGLBACKEND', 'pytorch');"
    bare = subprocess.run([sys.executable, "-c", env_code + "import dgl"], capture_output=True, text=True)
    via = subprocess.run([sys.executable, "-c", "from tag_core.gnn.compat import dgl; print(dgl.__version__)"],
                         capture_output=True, text=True)
    assert via.returncode == 0 and via.stdout.strip().startswith("2.1"), via.stderr[-500:]
    assert bare.returncode != 0 and "graphbolt" in (bare.stderr + bare.stdout).lower()


def test_heterograph_message_passing_and_edge_softmax_are_numerically_right():
    # Two "op" nodes feed op 2; one "dev" node hosts op 2.
    g = dgl.heterograph({("op", "feeds", "op"): (torch.tensor([0, 1]), torch.tensor([2, 2])),
                         ("dev", "hosts", "op"): (torch.tensor([0]), torch.tensor([2]))},
                        num_nodes_dict={"op": 3, "dev": 1})
    assert g.num_nodes("op") == 3 and g.num_edges("feeds") == 2 and g.num_edges("hosts") == 1
    sub = g["op", "feeds", "op"]
    logits = torch.tensor([[1.0], [3.0]])
    attention = edge_softmax(sub, logits)
    expected = torch.softmax(logits.squeeze(1), 0)
    assert torch.allclose(attention.squeeze(1), expected)
    with sub.local_scope():
        sub.srcdata["h"] = torch.tensor([[10.0], [20.0], [0.0]])
        sub.edata["a"] = attention
        sub.update_all(fn.u_mul_e("h", "a", "m"), fn.sum("m", "out"))
        out = sub.dstdata["out"]
    assert torch.allclose(out[2], expected[0] * 10 + expected[1] * 20)
    assert out[0].item() == 0.0 and out[1].item() == 0.0  # no incoming edges: the sum is zero, not garbage


def test_gradients_flow_through_edge_softmax():
    g = dgl.heterograph({("op", "feeds", "op"): (torch.tensor([0, 1]), torch.tensor([1, 0]))})
    logits = torch.randn(2, 1, requires_grad=True)
    edge_softmax(g, logits).sum().backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()
