"""The in-process backend hands broadcasts to its host as tensors (``Layout.copy``), not packed into one NumPy
buffer and unpacked: the host must see exactly what the wire form gives, and compute the same sums."""

from __future__ import annotations

import numpy as np
import torch

from fedcomp.platform.config import load_config
from fedcomp.platform.federation import ClientHost, Layout
from tests.conftest import small


def test_copy_gives_what_the_wire_round_trip_gives():
    state = {"x": torch.linspace(-1, 1, 6).reshape(2, 3), "c": torch.tensor(3.0, dtype=torch.float64) / 7,
             "a": torch.ones(2, requires_grad=True)}
    layout = Layout.of(state)
    wire, copied = layout.unpack(layout.pack(state)), layout.copy(state)
    assert list(copied) == list(wire) == ["a", "c", "x"]
    for key in wire:
        assert copied[key].dtype == wire[key].dtype == torch.float32
        assert copied[key].shape == wire[key].shape and not copied[key].requires_grad
        assert torch.equal(copied[key], wire[key])
    copied["x"] += 1  # a copy: the sender's tensor is untouched
    assert torch.equal(state["x"], torch.linspace(-1, 1, 6).reshape(2, 3))
    assert layout.receive(layout.pack(state))["c"].item() == layout.receive(state)["c"].item()


def test_a_host_given_tensors_computes_the_same_bits_as_one_given_the_packed_buffer():
    config = load_config("quickstart", small(**{"federation.clients": 3}))
    payload = {"x": torch.linspace(-1, 1, 11), "u": torch.zeros(11)}
    layout = Layout.of(payload)
    packed = ClientHost(config, range(3)).run("local_steps", 0, [0, 1, 2], layout.pack(payload), layout)
    tensors = ClientHost(config, range(3)).run("local_steps", 0, [0, 1, 2], payload, layout)
    np.testing.assert_array_equal(tensors.sums, packed.sums)
    assert tensors.losses == packed.losses and tensors.samples == packed.samples
    assert torch.equal(payload["x"], torch.linspace(-1, 1, 11))  # the broadcast was copied, not used in place
