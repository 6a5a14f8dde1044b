"""Helpers for the capture tests: a tiny model, and reading a run back."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tessera_tb.trace.step import KIND

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def tiny_model():
    """A small MLP and its optimiser step: a few ms per step on a CPU."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 64)

    def train_step() -> float:
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return float(loss.detach())

    return train_step


def host_self_ns(step) -> np.ndarray:
    """Per row: duration minus the durations of its direct children in the host op tree."""
    ev = step.events
    tree = np.isin(ev["kind"], [KIND[k] for k in ("cpu_op", "annotation", "runtime", "driver")])
    child = np.flatnonzero((ev["parent"] >= 0) & tree)
    sums = np.bincount(ev["parent"][child], weights=ev["dur_ns"][child], minlength=step.num_events)
    return ev["dur_ns"] - np.rint(sums).astype(np.int64)


def key_averages_view(step) -> tuple[np.ndarray, np.ndarray]:
    """(names, self_ns) of the cpu ops as torch's `key_averages()` counts them.

    torch's EventList drops a node whose parent has the same name and no other child
    (`_remove_dup_nodes`: `aten::mean` calling `aten::mean`), lifting its children to the
    parent, so the pair is one call whose self time is both self times. The step files keep
    both events; this applies torch's rule to them.
    """
    ev = step.events
    names = step.string_values(ev["name_id"])
    tree = np.isin(ev["kind"], [KIND[k] for k in ("cpu_op", "annotation", "runtime", "driver")])
    parent = np.where(tree, ev["parent"], -1).astype(np.int64)
    self_ns = host_self_ns(step).astype(np.int64)
    alive = tree.copy()
    changed = True
    while changed:
        changed = False
        n_children = np.bincount(parent[alive & (parent >= 0)], minlength=step.num_events)
        for row in np.flatnonzero(alive & (parent >= 0)).tolist()[::-1]:
            p = parent[row]
            if names[row] == names[p] and n_children[p] == 1:
                self_ns[p] += self_ns[row]
                alive[row] = False
                parent[parent == row] = p
                changed = True
                break
    ops = alive & (ev["kind"] == KIND["cpu_op"])
    return names[ops], self_ns[ops]
