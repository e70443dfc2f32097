"""Same numbers before and after a refactor: run every registered algorithm on a small configuration of the
tasks it was written for and record every metric and counter bit for bit.

    python benchmarks/same_numbers.py --out before.json      # at the old revision (e.g. in a git worktree)
    python benchmarks/same_numbers.py --out after.json       # at the new one
    python benchmarks/same_numbers.py --compare before.json after.json

Floats are stored as ``float.hex`` strings, so the comparison is exact. Runs use the local backend (the
conformance suite checks that Ray gives the same numbers). ``wall_time`` is left out. An algorithm that a
revision does not know is reported as missing on that side, not as a difference.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

import fedcomp

SMALL_LOGREG = {"task.test_samples": 2000, "federation.clients": 4, "algorithm.local_steps": 5,
                "algorithm.first_batch": 4}
AUC = {"task.dataset": "breast-cancer", "task.model": "linear", "algorithm.local_steps": 2, "run.rounds": 3,
       "run.eval_every": 1}
DRO = {"run.rounds": 4, "run.eval_every": 2, "algorithm.lr_milestones": [2]}
MINIMAX = {"run.rounds": 3, "federation.clients": 6, "algorithm.inner_steps": 3, "algorithm.local_steps": 2}
HR = {"run.rounds": 2, "federation.clients": 6, "federation.clients_per_round": 3, "task.per_client": 40,
      "algorithm.inner_steps": 2, "algorithm.neumann_terms": 3, "task.hidden": 20}

CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "fcsg": ("quickstart", SMALL_LOGREG),
    "fcsg-m": ("quickstart", SMALL_LOGREG),
    "acc-fcsg-m": ("quickstart", SMALL_LOGREG),
    "fcsg-m/auprc": ("auprc-table2-offline", {"federation.clients": 4, "run.rounds": 3, "algorithm.local_steps": 2,
                                              "task.dataset": "breast-cancer", "task.model": "linear"}),
    "acc-fcsg-m/auprc": ("auprc-table2-offline", {"federation.clients": 4, "run.rounds": 3, "algorithm.local_steps": 2,
                                                  "task.dataset": "breast-cancer", "task.model": "linear"}),
    "fedavg": ("auc-table1-offline", AUC),
    "local-sgdm": ("auc-table1-offline", AUC),
    "local-sgdm-rl": ("auc-table1-offline", AUC),
    "scaffold": ("auc-table1-offline", {**AUC, "federation.clients_per_round": 2}),
    "fedprox": ("auc-table1-offline", AUC),
    "local-scgdam": ("auc-table1-offline", AUC),
    "local-sgdam": ("auc-table1-offline", AUC),
    "coda": ("auc-table1-offline", {**AUC, "run.rounds": 4}),
    "coda-plus": ("auc-table1-offline", {**AUC, "run.rounds": 4}),
    "local-scgdam/conv": ("auc-table1-offline", {"algorithm.local_steps": 2, "run.rounds": 2, "run.eval_every": 1}),
    "fednest": ("fednest-minimax", MINIMAX),
    "fednest-sgd": ("fednest-minimax", MINIMAX),
    "lfednest": ("fednest-minimax", MINIMAX),
    "lfednest-svrg": ("fednest-minimax", MINIMAX),
    "fedavg-s": ("fednest-minimax", {"run.rounds": 3, "federation.clients": 6, "algorithm.local_steps": 2}),
    "fednest/hr": ("fednest-hr-offline", HR),
    "fednest/hr-deterministic": ("fednest-hr-offline", {**HR, "algorithm.ihgp": "deterministic"}),
    "fednest/hr-code": ("fednest-hr-offline", {**HR, "algorithm.ihgp": "code"}),
    "fednest-sgd/hr": ("fednest-hr-offline", HR),
    "lfednest/hr": ("fednest-hr-offline", HR),
    "lfednest-svrg/hr": ("fednest-hr-offline", HR),
    "feddro": ("feddro-offline", DRO),
    "feddro/negative": ("feddro-negative-result", {"run.rounds": 4, "run.eval_every": 2}),
    "fedavg-co-shared-y": ("feddro-negative-result", {"run.rounds": 4, "run.eval_every": 2}),
    "fedavg-co-1": ("feddro-negative-result", {"run.rounds": 4, "run.eval_every": 2}),
    "fedavg-co-2": ("feddro-negative-result", {"run.rounds": 4, "run.eval_every": 2}),
    "gcivr": ("feddro-offline", DRO),
    "parallel-mbsgd": ("feddro-offline", DRO),
    "parallel-fastdro": ("feddro-offline", DRO),
    "parallel-pdsgd": ("feddro-offline", DRO),
    "local-scgd": ("maml-sinewave", {"run.rounds": 2, "run.eval_every": 1, "algorithm.local_steps": 3,
                                     "task.eval_tasks": 10}),
    "local-scgdm": ("maml-sinewave", {"run.rounds": 2, "run.eval_every": 1, "algorithm.local_steps": 3,
                                      "task.eval_tasks": 10}),
    "fcsg-m/maml": ("maml-fewshot-mnist", {"run.rounds": 2, "run.eval_every": 1, "algorithm.local_steps": 2,
                                           "task.eval_tasks": 5}),
    "local-scgdm/maml": ("maml-fewshot-mnist", {"run.rounds": 2, "run.eval_every": 1, "algorithm.local_steps": 2,
                                                "task.eval_tasks": 5, "algorithm.lr": 0.1}),
}


def _exact(value: Any) -> Any:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else value.hex()
    if hasattr(value, "item"):
        return _exact(value.item())
    return value


def run_case(name: str, preset: str, overrides: dict[str, Any], out: str) -> dict[str, list[Any]] | str:
    algorithm = name.split("/")[0]
    settings = {"algorithm.name": algorithm, "federation.backend": "local", "run.progress": "none", "run.out": out,
                "run.on_divergence": "continue",
                **overrides}
    try:
        metrics = fedcomp.run(preset, settings).metrics
    except Exception as error:  # a case this revision cannot run is recorded, not fatal
        return f"error: {type(error).__name__}: {error}"[:300]
    return {c: [_exact(v) for v in metrics[c]] for c in metrics.columns if c != "wall_time"}


def compare(before_path: str, after_path: str) -> int:
    before, after = (json.loads(Path(p).read_text()) for p in (before_path, after_path))
    same = differ = 0
    for name in sorted(set(before) | set(after)):
        if name not in before or name not in after:
            print(f"{name}: only in {'after' if name in after else 'before'}")
            continue
        a, b = before[name], after[name]
        if a == b:
            same += 1
            continue
        differ += 1
        if isinstance(a, str) or isinstance(b, str):
            print(f"{name}: before {a if isinstance(a, str) else 'ran'}; after {b if isinstance(b, str) else 'ran'}")
            continue
        cols = sorted(c for c in set(a) | set(b) if a.get(c) != b.get(c))
        print(f"{name}: differs in {', '.join(cols)}")
    print(f"{same} identical, {differ} different")
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the recorded numbers here (JSON)")
    parser.add_argument("--only", nargs="*", help="case names to run (default: all)")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    torch.set_num_threads(1)
    recorded: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as out:
        for name, (preset, overrides) in CASES.items():
            if args.only and name not in args.only:
                continue
            recorded[name] = run_case(name, preset, overrides, out)
            status = recorded[name] if isinstance(recorded[name], str) else "ok"
            print(f"{name}: {status}", file=sys.stderr, flush=True)
    text = json.dumps(recorded, indent=1, sort_keys=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
