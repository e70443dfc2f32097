"""A quiet start: a newcomer's run prints fedcomp's own lines only; Ray's token-authentication notice for a
local instance is dropped while token authentication stays on, and Ray's warning for an instance without
authentication still shows."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from fedcomp.actors.quiet import AUTH_LOGGER, CLIENT_LOGS_LOGGER, quiet_ray_start
from fedcomp.cli import main

OURS = ("fedcomp: ", "round ")
SMALL = ["--set", "federation.clients=4", "--set", "algorithm.local_steps=5", "--set", "task.test_samples=2000"]


@contextlib.contextmanager
def caught(caplog, name: str):
    """caplog's handler on the logger ``name`` itself, the logger's records going nowhere else meanwhile: whether
    Ray's loggers propagate to the root (caplog's place) depends on what configured Ray's logging before."""
    logger, propagate = logging.getLogger(name), logging.getLogger(name).propagate
    logger.addHandler(caplog.handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(caplog.handler)
        logger.propagate = propagate


def test_only_the_token_auth_enabled_notice_is_dropped(caplog):
    from ray._private.authentication import authentication_token_setup as setup

    quiet_ray_start()
    quiet_ray_start()  # idempotent
    assert len(logging.getLogger(AUTH_LOGGER).filters) == 1
    with caught(caplog, AUTH_LOGGER):
        setup._warn_token_auth_enabled()
        setup._warn_token_auth_disabled()
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and messages[0].startswith("Token authentication is disabled")


def test_only_the_ray_client_servers_sigterm_notice_is_dropped(caplog):
    """What a ``ray://`` run's console got from the cluster's process that serves the job, as it started."""
    import ray.util.client.logsclient  # noqa: F401  # as a ray:// run has it: its logger does not propagate

    quiet_ray_start()
    quiet_ray_start()
    logger = logging.getLogger(CLIENT_LOGS_LOGGER)
    assert len(logger.filters) == 1
    with caught(caplog, CLIENT_LOGS_LOGGER):
        logger.warning("SIGTERM handler is not set because current thread is not the main thread.")
        logger.warning("Log channel dropped, retrying.")
    assert [r.getMessage() for r in caplog.records] == ["Log channel dropped, retrying."]


def test_a_local_run_prints_nothing_but_its_progress_and_results(tmp_path, capsys):
    assert main(["run", "quickstart", "--set", "federation.backend=local", "--set", "run.rounds=4", *SMALL,
                 "--set", "run.progress=log", "--set", f"run.out={tmp_path}"]) == 0
    captured = capsys.readouterr()
    assert captured.err and all(line.startswith("round ") for line in captured.err.splitlines())
    assert [line.split()[0] for line in captured.out.splitlines()] == ["run", "results:", "curves:", "tracking:"]


@pytest.mark.ray
@pytest.mark.slow
def test_the_default_run_on_its_own_local_ray_is_quiet_and_keeps_token_auth(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    with tempfile.TemporaryDirectory(prefix="fcq") as ray_tmp:  # short: Ray's socket paths must fit 107 bytes
        env.update(HOME=str(home), RAY_TMPDIR=ray_tmp, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
        done = subprocess.run(
            [sys.executable, "-m", "fedcomp", "run", "quickstart", "--set", "run.rounds=4", *SMALL,
             "--set", f"run.out={tmp_path / 'results'}"],
            env=env, capture_output=True, text=True, timeout=300,
        )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines[:2] == ["fedcomp: starting local Ray ...", lines[1]] and lines[1].startswith("fedcomp: Ray ready in ")
    assert [line for line in lines if not line.startswith(OURS)] == []
    assert (home / ".ray" / "auth_token").is_file()  # Ray's token authentication was on for this instance
