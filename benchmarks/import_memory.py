"""The memory every fedcomp process pays before it holds a client: what importing the CUDA build of torch (and
Ray, and fedcomp's client actor) costs one fresh process, and where that memory sits.

    python benchmarks/import_memory.py        # writes benchmarks/IMPORT_MEMORY.md

Each step runs in a fresh interpreter (one per row), so nothing is carried over from an earlier import. Memory is
given as USS (the process's private pages: what one more such process adds) and PSS (private pages plus its share
of library pages it maps together with other processes on the machine -- so PSS falls when other torch processes
run; ``/proc/self/smaps_rollup``). The breakdown
groups ``/proc/self/smaps`` mappings by the file they map (anonymous mappings by the library they follow, which
is where a library's zero-initialised data lies). It is the floor of the speed issue's memory target (1,000
clients in 2 actors under 1.2 GiB for the whole process tree): every Ray process that imports torch pays it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import common

STEPS = (
    ("python (no imports)", []),
    ("import torch", ["torch"]),
    ("import ray", ["ray"]),
    ("import torch, ray", ["torch", "ray"]),
    ("import fedcomp.actors.client_actor (a client actor's imports)", ["fedcomp.actors.client_actor"]),
    ("import fedcomp.actors.server_actor (the server actor's imports)", ["fedcomp.actors.server_actor"]),
)
PROBE = r"""
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
rollup = {l.split(":")[0]: int(l.split()[1]) for l in open("/proc/self/smaps_rollup") if l.split()[-1] == "kB"}
pss, uss = rollup["Pss"], rollup["Private_Clean"] + rollup["Private_Dirty"]
parts, owner, last_file = {}, None, "[before any file]"
for line in open("/proc/self/smaps"):
    fields = line.split()
    if fields and "-" in fields[0] and len(fields) >= 5 and ":" in fields[3]:
        path = fields[5] if len(fields) > 5 else ""
        if path.startswith("/"):
            last_file = path.rsplit("/", 1)[-1]
            owner = last_file
        else:
            owner = path or f"anonymous after {last_file}"
    elif fields and fields[0] == "Pss:":
        parts[owner] = parts.get(owner, 0) + int(fields[1])
print(json.dumps({"pss_kib": pss, "uss_kib": uss, "parts": parts}))
"""


def measure(modules: list[str]) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, *modules], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> None:
    rows = ["| process | USS (MiB) | PSS (MiB) |", "|---|---:|---:|"]
    results = {label: measure(modules) for label, modules in STEPS}
    for label, result in results.items():
        rows.append(f"| {label} | {result['uss_kib'] / 1024:.0f} | {result['pss_kib'] / 1024:.0f} |")
    torch_parts = sorted(results["import torch"]["parts"].items(), key=lambda kv: -kv[1])[:8]
    rows += ["", "Where `import torch` puts its memory (the 8 largest mappings, MiB of PSS):", "",
             "| mapping | PSS (MiB) |", "|---|---:|"]
    rows += [f"| {name} | {kib / 1024:.1f} |" for name, kib in torch_parts]
    client = results["import fedcomp.actors.client_actor (a client actor's imports)"]
    server = results["import fedcomp.actors.server_actor (the server actor's imports)"]
    uss = [p["uss_kib"] / 2**20 for p in (client, server)]
    pss = [p["pss_kib"] / 2**20 for p in (client, server)]
    rows += ["", f"A Ray run with a driver, a server actor and 2 client actors holds 4 processes with at least "
             f"these imports (the driver's are the server actor's and pandas, which writes the results): "
             f"{2 * uss[0] + 2 * uss[1]:.2f} GiB of private memory at least ({2 * pss[0] + 2 * pss[1]:.2f} GiB of "
             f"PSS when one of them is measured beside the machine's other processes), before any client, Ray's "
             f"own processes and the clients' data; {2 * uss[0] + uss[1]:.2f} GiB private with the server inside "
             f"the driver. The speed issue's target for the whole tree is 1.2 GiB."]
    common.table_report(common.HERE / "IMPORT_MEMORY.md", "# What a process pays to import torch (CUDA build)",
                        common.generated_by("Measured") + ". Each row a fresh interpreter.", rows)


if __name__ == "__main__":
    main()
