"""`fedcomp bench` smoke tests: tiny arguments through the CLI; the table has a row per runner and client
count, and fedcomp's final weights are bit-identical to the plain PyTorch loop's and torch.optim's (same numbers)."""

from __future__ import annotations

import pytest

from fedcomp.cli import main
from tests.conftest import NEEDS_TORCH_COMPILE

TINY = ["bench", "--clients", "20", "40", "--cohort", "4", "--rounds", "2", "--local-steps", "2", "--repeats", "1",
        "--markdown"]


def table(out: str) -> dict[tuple[str, int], dict[str, str]]:
    """The markdown table's rows keyed by (runner, clients)."""
    lines = [ln for ln in out.splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = dict(zip(header, (c.strip() for c in line.strip("|").split("|"))))
        rows[(cells["runner"], int(cells["clients"]))] = cells
    return rows


def check(out: str, runners: list[str]) -> dict[tuple[str, int], dict[str, str]]:
    rows = table(out)
    assert set(rows) == {(r, n) for r in runners for n in (20, 40)}
    for (runner, n), cells in rows.items():
        assert float(cells["round (ms, median)"]) > 0
        assert float(cells["start-up (s)"]) >= 0
        assert len(cells["final weights sha256"]) == 12
        if runner != "plain":
            assert cells["final weights sha256"] == rows[("plain", n)]["final weights sha256"], (runner, n)
            assert float(cells["max abs diff vs plain"]) == 0.0
            assert cells["overhead vs plain (ms/round)"] != "—"
    assert rows[("local", 20)]["final weights sha256"] != rows[("local", 40)]["final weights sha256"]
    assert "machine:" in out and "torch " in out and "targets (information only" in out
    return rows


@pytest.mark.parametrize("hidden", [["64"], ["400", "256"]], ids=["pure-steps", "in-place-steps"])
def test_bench_local_plain_loop_and_torch_optim_give_the_same_weights(capsys, hidden):
    """fedcomp's SGD step is torch.optim's fused ``p += -lr g``: the local backend, the plain loop and
    ``torch.optim.SGD`` on an ``nn.Module`` end on the same bits, with the out-of-place step (a small MLP) and
    the in-place one (118k parameters, over ``IN_PLACE_MIN_FLOATS``)."""
    assert main([*TINY, "--hidden", *hidden, "--runners", "local", "plain", "optim"]) == 0
    check(capsys.readouterr().out, ["local", "plain", "optim"])


@pytest.mark.slow
@pytest.mark.ray
def test_bench_all_runners_on_ray(keeping, capsys):
    assert main(TINY) == 0
    out = capsys.readouterr().out
    rows = check(out, ["ray", "local", "plain"])
    assert rows[("ray", 20)]["actors"] == "2" and rows[("ray", 40)]["actors"] == "2"
    assert "ray 2" in out and "Ray overhead over the plain loop <= 50 ms/round" in out


def test_bench_plain_text_table_and_bad_input(capsys):
    args = ["bench", "--clients", "3", "--cohort", "5", "--rounds", "1", "--local-steps", "1", "--repeats", "1",
            "--runners", "plain"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "runner" in out and "\nplain " in out and "clients per round 3 of 3" in out
    assert main(["bench", "--clients", "0", "--runners", "plain"]) == 2
    assert "--clients" in capsys.readouterr().err


def exit_code(argv: list[str]) -> int:
    """The CLI's exit code for ``argv``, argparse's refusals (SystemExit) included."""
    try:
        return main(argv)
    except SystemExit as stop:
        return int(stop.code)


@pytest.mark.parametrize("argv, says", [
    (["--quick"], "unrecognized arguments: --quick"),  # the peers' flags belong to benchmarks/peers.py
    (["--results", "x.md"], "unrecognized arguments: --results x.md"),
    (["--runners", "flower"], "argument --runners: invalid choice: 'flower'"),
    (["--repeats", "0"], "--repeats = 0: must be >= 1"),
    (["--set", "task.hidden=3"], "--set task.hidden: the workload is the benchmark's; allowed: federation options"),
    (["--set", "federation.clients=5"], "--set federation.clients: the workload is the benchmark's"),
    (["--set", "federation.torch_compile=fast"], "federation.torch_compile = 'fast': Input should be a valid boolean"),
    (["--set", "torch_compile"], "--set 'torch_compile': expected section.key=value"),
])
def test_bench_bad_flags(capsys, argv, says):
    assert exit_code(["bench", *argv]) == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize("argv, command", [
    ([], "python benchmarks/peers.py"),
    (["--quick", "--no-install"], "python benchmarks/peers.py --quick --no-install"),
])
def test_bench_peers_says_where_the_peers_benchmark_went(capsys, argv, command):
    assert main(["bench", "--peers", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fedcomp: error: --peers:") and err[0].endswith(f"`{command}`")


@pytest.mark.slow
@NEEDS_TORCH_COMPILE
def test_bench_sets_a_federation_option_for_fedcomps_runners_only(capsys):
    """``--set federation.torch_compile=true``: the local backend's weights move by float32 rounding from the plain
    loop's (the compiled gradient ran), the plain loop stays the reference, and the table says what was set."""
    assert main([*TINY, "--runners", "local", "plain", "--set", "federation.torch_compile=true"]) == 0
    out = capsys.readouterr().out
    rows = table(out)
    for n in (20, 40):
        assert rows[("local", n)]["final weights sha256"] != rows[("plain", n)]["final weights sha256"]
        assert 0 < float(rows[("local", n)]["max abs diff vs plain"]) < 1e-6
    assert "fedcomp's runners with federation.torch_compile=True" in out
