"""A trial's placement group: one bundle for the trainable, one for the server actor where there is one, one per
client actor, GPU only where the cluster has GPUs; the per-actor shares pinned into the trial's config; and what a
trial sets up in its process."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fedcomp.actors.quiet_exit import drop_lost_exits_in_a_worker
from fedcomp.platform.errors import ResourceError
from fedcomp.sweeps.spec import load_spec
from fedcomp.sweeps.trial import concurrent_trials, pinned_config, placement_group_factory, trial_resources
from tests.conftest import unraisable_hooks_in_a_fresh_worker

BASE = {"base": "quickstart", "set": {"federation.clients": 4, "federation.clients_per_actor": 2,
                                      "federation.server": "actor"}}


def test_ray_trial_has_trainable_server_and_client_actor_bundles():
    s = load_spec({**BASE, "cpus_per_trial": 1.0})
    res = trial_resources(s, s.base_config(), cluster_has_gpus=False)
    assert res.bundles == ({"CPU": 0.25},) * 4
    assert res.total == {"CPU": 1.0} and res.gpus_per_client == 0.0


@pytest.mark.parametrize("server", ["driver", "replicated", None])
def test_a_trial_without_a_server_actor_has_no_bundle_for_one(server):
    fed = {k: v for k, v in BASE["set"].items() if k != "federation.server"}  # None: the default, replicated
    s = load_spec({**BASE, "set": {**fed, **({"federation.server": server} if server else {})}, "cpus_per_trial": 1.5})
    res = trial_resources(s, s.base_config(), cluster_has_gpus=False)
    assert res.bundles == ({"CPU": 0.5},) * 3  # the trainable and two client actors


def test_gpu_bundles_only_where_the_cluster_has_gpus():
    s = load_spec({**BASE, "gpus_per_trial": 1.0})
    res = trial_resources(s, s.base_config(), cluster_has_gpus=True)
    assert [b.get("GPU", 0.0) for b in res.bundles] == [0.0, 0.0, 0.5, 0.5]
    assert res.gpus_per_client == 0.25
    explicit = trial_resources(s, s.base_config(**{"federation.gpus_per_client": 0.1}), cluster_has_gpus=True)
    assert [b.get("GPU", 0.0) for b in explicit.bundles] == [0.0, 0.0, 0.2, 0.2]


def test_swept_client_count_changes_the_bundles():
    s = load_spec({**BASE, "grid": {"federation.clients": [2, 6]}})
    sizes = [len(placement_group_factory({"point": p}, s, False).bundles) for p in s.points()]
    assert sizes == [3, 5]


def test_local_backend_trial_is_one_bundle_and_shares_are_pinned():
    s = load_spec({**BASE, "set": {**BASE["set"], "federation.backend": "local"}, "cpus_per_trial": 0.5})
    assert trial_resources(s, s.base_config(), False).bundles == ({"CPU": 0.5},)
    config = pinned_config(load_spec(BASE), {}, False)
    assert config.federation.cpus_per_actor == 0.25 and config.federation.gpus_per_client == 0.0
    assert config.run.progress == "none"


@pytest.mark.parametrize(("cpus", "gpus", "actors"), [(1.0, 0.0, 1), (2.0, 0.0, 2), (3.0, 0.0, 3), (1.0, 1.0, 2)])
def test_auto_packing_sizes_a_trials_actors_to_the_trial_not_the_cluster(cpus, gpus, actors):
    s = load_spec({"base": "quickstart", "set": {"federation.clients": 6, "federation.clients_per_actor": "auto"},
                   "cpus_per_trial": cpus, "gpus_per_trial": gpus or 1.0})
    res = trial_resources(s, s.base_config(), cluster_has_gpus=bool(gpus))
    assert len(res.bundles) == actors + 1 and res.clients_per_actor == 6 // actors  # the trainable and the actors
    pinned = pinned_config(s, {}, bool(gpus))
    assert pinned.federation.clients_per_actor == 6 // actors  # the run inside never re-sizes against the cluster


def test_too_many_actors_for_the_trial_budget_is_one_line():
    s = load_spec({**BASE, "set": {"federation.clients": 100000, "federation.clients_per_actor": 1}, "cpus_per_trial": 1.0})
    with pytest.raises(ResourceError, match="cpus_per_trial = 1 is too small for 100000 client actors"):
        trial_resources(s, s.base_config(), False)


def _configs(spec):
    return [spec.base_config(**point) for point in spec.points()]


@pytest.mark.parametrize(("cpus", "expected"), [(2, 1), (3, 1), (4, 1), (8, 2), (16, 4), (64, 16)])
def test_by_default_ray_trials_run_as_many_at_once_as_give_each_process_a_cpu(cpus, expected):
    # BASE: the trainable, the server actor and two client actors: four processes a trial
    s = load_spec(BASE)
    assert concurrent_trials(s, _configs(s), cpus, False) == expected


def test_the_default_concurrency_counts_a_grids_largest_trial():
    s = load_spec({**BASE, "grid": {"federation.clients": [2, 10]}})  # 3 and 7 processes
    assert concurrent_trials(s, _configs(s), 16, False) == 2
    replicated = load_spec({**BASE, "set": {**BASE["set"], "federation.server": "replicated"}})
    assert concurrent_trials(replicated, _configs(replicated), 16, False) == 5


def test_a_specs_max_concurrent_is_the_concurrency():
    s = load_spec({**BASE, "max_concurrent": 3})
    assert concurrent_trials(s, _configs(s), 2, False) == 3


@pytest.mark.parametrize("override", [{"federation.backend": "local"}, {"federation.cpus_per_actor": 0.25}])
def test_local_trials_and_pinned_actor_shares_leave_concurrency_to_tunes_fit(override):
    s = load_spec({**BASE, "set": {**BASE["set"], **override}})
    assert concurrent_trials(s, _configs(s), 2, False) is None


@pytest.mark.slow
def test_a_trial_process_drops_lost_exits():
    """Tune stops a trial's process with SIGTERM (all of them on Ctrl-C): its process leaves out the traceback of
    one landing in a weakref callback (:mod:`fedcomp.actors.quiet_exit`)."""
    code = ("import sys; from fedcomp.sweeps.spec import load_spec; from fedcomp.sweeps.trial import trial_process; "
            "trial_process(load_spec(" + repr(BASE) + ").model_dump_json(), {}); print(type(sys.unraisablehook).__name__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["DropLostExits"]


@pytest.mark.ray
def test_a_trial_process_drops_lost_exits_from_loading_its_trainable_and_a_driver_keeps_pythons_reports(ray_session):
    """Tune may start a trial process and stop it with SIGTERM before it runs a trial: the lost ``SystemExit`` was
    then reported as "Exception ignored ... SystemExit: 1" on the sweep's terminal (fedcomp.actors.quiet_exit)."""
    before, after = unraisable_hooks_in_a_fresh_worker(ray_session, "fedcomp.sweeps.trial")
    assert before != "DropLostExits" and after == "DropLostExits"
    before = sys.unraisablehook  # this process: a driver, with Ray up
    drop_lost_exits_in_a_worker()
    assert sys.unraisablehook is before
