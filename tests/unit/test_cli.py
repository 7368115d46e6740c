"""The simulator's command line: useful output, and clear errors instead of tracebacks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swarm.cli import build_parser
from swarm.cli.local import _options
from tests.unit.helpers import run_cli


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["sim", "run", "--budget", "-5"], "--budget: -5 is out of range"),
        (["sim", "run", "--workers", "0"], "--workers: 0 is out of range"),
        (["sim", "run", "--share", "0"], "the share must be in (0, 1]"),
        (["sim", "run", "--share", "1.2"], "the share must be in (0, 1]"),
        (["sim", "run", "--failure-rate", "1"], "a rate must be in [0, 1)"),
        (["sim", "run", "--min-tokens", "20000"], "tokens: need 1 <= min <= max"),
        (["sim", "run", "--kill-at", "10"], "--kill-at: needs --state FILE"),
        (["sim", "sweep", "--workers", "10,x"], "'x' is not a whole number"),
        (["local", "up", "--worker-timeout-s", "5"], "--worker-timeout-s: must be 10 to 900"),
        (["local", "up", "--worker-timeout-s", "901"], "--worker-timeout-s: must be 10 to 900"),
        (["bench", "governor", "--reserve", "1"], "--reserve"),
        (
            ["bench", "governor", "--reserve", "0.99"],
            "--reserve: leaves no room for the largest draw above it in one shard",
        ),
    ],
)
def test_bad_options_get_a_clear_error(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(args, capsys)
    assert code == 2
    assert message in err
    assert "Traceback" not in err


def test_unreadable_or_damaged_state_files_are_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(["sim", "resume", "--state", str(tmp_path / "missing.json")], capsys)
    assert code == 2 and "cannot read" in err
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    code, _, err = run_cli(["sim", "resume", "--state", str(garbage)], capsys)
    assert code == 2 and "is not valid JSON" in err
    other = tmp_path / "other.json"
    other.write_text('{"format": "something-else"}')
    code, _, err = run_cli(["sim", "resume", "--state", str(other)], capsys)
    assert code == 2 and "not a simulator state file" in err


def test_run_prints_the_healthy_line_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["sim", "run", "--policy", "book"], capsys)
    assert code == 0
    assert out.splitlines()[0] == (
        "run.completed: completed 400/400 in 1,746s | spent 4,905,337 of 6,000,000 tokens "
        "(81.8%) | retries 9 | dead-lettered 0"
    )
    code, out, _ = run_cli(
        ["sim", "run", "--budget", "2500000", "--json", "--policy", "book"], capsys
    )
    doc = json.loads(out)
    assert code == 0 and doc["state"] == "exhausted"
    assert doc["elapsed_s"] == 1_031 and doc["completed"] == 206 and doc["spent"] == 2_498_987
    assert len(doc["remainder_units"]) == doc["remainder"] == 194


def test_what_if_options_change_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(
        ["sim", "run", "--units", "50", "--quota-tpm", "600000", "--workers", "300", "--json"],
        capsys,
    )
    doc = json.loads(out)
    assert code == 0 and doc["units"] == 50 and doc["state"] == "completed"


def test_sweep_prints_the_table_with_n_star(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(
        ["sim", "sweep", "--workers", "25,200", "--json", "--policy", "book"], capsys
    )
    doc = json.loads(out)
    assert code == 0 and doc["n_star"] == 119
    assert [(r["workers"], r["elapsed_s"]) for r in doc["rows"]] == [(25, 5_091), (200, 1_604)]


def test_the_governor_benchmarks_lane_keeps_the_reserve_it_is_given() -> None:
    from swarm.bench.governor import BenchConfig
    from swarm.core.records import Lane

    assert BenchConfig().governor_config().reserve(Lane.NORMAL) == 0  # the issue's: it books
    assert BenchConfig(reserve=0.05).governor_config().reserve(Lane.NORMAL) == 15_000


def test_local_up_takes_the_workers_timeout_its_lease_follows() -> None:
    parser = build_parser()
    args = parser.parse_args(["local", "up", "--worker-timeout-s", "480"])
    assert _options(args).worker_timeout_s == 480
    # the default: LocalOptions' (the lease 6 x 240 s over the time scale of 10: 144 s)
    assert _options(parser.parse_args(["local", "up"])).worker_timeout_s == 240
