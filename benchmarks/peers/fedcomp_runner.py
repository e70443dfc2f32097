"""fedcomp's runners of ``benchmarks/peers.py``: the Ray backend (its server in an actor, or in the driver's
process: ``ray-driver``; each cohort member run by the actor hosting it rather than spread evenly:
``ray-home``; the calls with small payloads through a compiled Ray graph: ``ray-graph``; each actor's cohort
members stepped together under ``vmap``, ``federation.vectorise``: ``ray-vmap``; both the last and the server in
the driver: ``ray-driver-vmap``; the round program replicated on the client actors, ``federation.server:
replicated``: ``ray-replicated``, and vectorised: ``ray-replicated-vmap``, or with fused SGD steps,
``federation.fused_sgd``: ``ray-replicated-fused``, or with the loss gradient compiled, ``federation.torch_compile``:
``ray-replicated-compiled``), the local backend (and vectorised: ``local-vmap``; fused: ``local-fused``; compiled:
``local-compiled``), the plain loop and the same rounds with ``torch.optim.SGD``
stepping an ``nn.Module`` in place (``optim``).

Each runs in its own process like the peers, so start-up (imports, Ray's start, actors) and the memory
of the whole process tree are measured the same way for all. fedcomp draws the workload's batches from
its task's keyed generators -- the very calls the harness made to write the workload's ``.npz`` that
the peers read -- so every runner trains on the same data; the plain loop's final weights are the
reference. ``workers`` is the number of Ray client actors (the local backend and the plain loop are
one process).

Usage (the harness does this): ``python fedcomp_runner.py --runner ray --workload SPEC.json --out RESULT.json``;
``--memory-run`` leaves the final model unread (an empty array), as a run measured for its memory: reading it would
make a Ray run's driver import torch, which fedcomp's driver does not otherwise.
"""

from __future__ import annotations

import argparse

import _peer_common as common

common.one_thread()

SERVERS = {"ray-driver": "driver", "ray-replicated": "replicated"}
"""Runner (less ``-vmap``) -> ``federation.server`` where it is not the server actor."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runner", required=True, choices=[
        "ray", "ray-driver", "ray-home", "ray-graph", "ray-vmap", "ray-driver-vmap", "ray-replicated",
        "ray-replicated-vmap", "ray-replicated-fused", "ray-replicated-compiled", "local", "local-vmap", "local-fused",
        "local-compiled", "plain", "optim"])
    parser.add_argument("--workload", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--memory-run", action="store_true")
    args = parser.parse_args()

    import numpy as np

    from fedcomp.bench import bench_config, run_fedcomp, run_optim, run_plain
    from fedcomp.platform.environment import torch_build

    spec = common.load_spec(args.workload)
    backend = "local" if args.runner in ("local", "local-vmap", "local-fused", "local-compiled", "plain", "optim") else "ray"
    base = args.runner.removesuffix("-vmap").removesuffix("-fused").removesuffix("-compiled")
    config = bench_config(int(spec["clients"]), int(spec["cohort"]), int(spec["rounds"]), int(spec["local_steps"]),
                          list(spec["sizes"])[1:-1], backend, actors=int(spec["workers"]),
                          server=SERVERS.get(base, "actor"),
                          routing="home" if args.runner == "ray-home" else "balanced",
                          transport="graph" if args.runner == "ray-graph" else "calls",
                          vectorise=args.runner.endswith("-vmap"), fused_sgd=args.runner.endswith("-fused"),
                          torch_compile=args.runner.endswith("-compiled"))
    runs = {"plain": run_plain, "optim": run_optim}
    if args.runner in runs:
        m = runs[args.runner](config, 0)
    else:
        m = run_fedcomp(config, backend, 0, final_model=not args.memory_run)

    clock = common.Clock()
    clock.rounds_started_at = m.rounds_started_at
    t = m.rounds_started_at
    for dt in m.round_s:
        t += dt
        clock.round_ends.append(t)
    versions = {"torch": torch_build()}
    if backend == "ray":
        import ray

        versions["ray"] = ray.__version__
    final = m.final.numpy() if m.final is not None else np.zeros(0, dtype=np.float32)
    common.write_result(args.out, clock, final, versions)


if __name__ == "__main__":
    main()
