"""The in-process server: it computes and evaluates with one thread under ``run.deterministic``, as the replicated
server and the server actor do, so the local backend's metrics are the Ray backend's bit for bit."""

from __future__ import annotations

import torch

from fedcomp.backends import make_server
from fedcomp.platform.accelerator import one_thread
from fedcomp.platform.config import load_config

# quickstart's full test set: a mean over 50,000 samples, which torch splits across threads
QUICK = {"federation.backend": "local", "federation.clients": 4, "algorithm.local_steps": 5, "run.progress": "none"}


def test_the_server_evaluates_with_one_thread_whatever_the_process_has():
    before = torch.get_num_threads()
    server = make_server(load_config("quickstart", QUICK))
    loose = make_server(load_config("quickstart", {**QUICK, "run.deterministic": False}))
    split_differs = 0
    try:
        torch.set_num_threads(2)
        for _ in range(8):
            server.run_round()
            loose.run_round()
            tensors = server.tensors()
            with one_thread():
                want = server._evaluate(tensors)
            split = server._evaluate(tensors)  # the process's 2 threads
            split_differs += split != want
            assert server.evaluate() == want
            assert torch.get_num_threads() == 2  # the process's setting is back
            assert loose.evaluate() == loose._evaluate(loose.tensors())  # deterministic: false keeps the threads
    finally:
        torch.set_num_threads(before)
    assert split_differs  # 2 threads do end some evaluation in other last bits: the test can fail
