"""Edge lines of a sweep with a text panel (e.g. ``panels: [task.dataset]``): the group's dataset name is printed
as text (it crashed ``--extend-edges``' summary and the edge warnings with a format error)."""

from fedcomp.sweeps.edges import Edge
from fedcomp.sweeps.extend import _who


def test_edge_warning_names_a_text_panel_value():
    group = (("task.dataset", "breast-cancer"), ("algorithm.local_steps", 4), ("algorithm.name", "coda"))
    edge = Edge(group, "algorithm.lr", 10.0, "high", "grid", (0.1, 1.0, 10.0), next=31.6227766017)
    assert edge.warning() == ("edge: coda at dataset=breast-cancer, local_steps=4: best algorithm.lr = 10 is the "
                              "largest value tried; widen the grid (next: 31.6228)")
    assert _who(group) == "coda at dataset=breast-cancer, local_steps=4"
