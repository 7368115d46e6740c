"""`swarm sim run` and `swarm sim sweep` with the scheduling policies: the ratio to the floor,
the comparison table, its JSON and its picture."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.helpers import run_cli

SMALL = ["--units", "40", "--quota-tpm", "120000"]


def test_run_reports_the_default_policy_and_its_ratio_to_the_floor(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run_cli(["sim", "run", "--workers", "200", "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["state"] == "completed"
    assert doc["policy"] == "largest-first"
    assert doc["elapsed_s"] == 1_524  # the book: 1,604
    assert doc["floor"] == {
        "seconds": 1_293,
        "bound_by": "quota",
        "quota_s": 1_293,
        "workers_s": 613,
        "chain_s": 660,
    }
    assert doc["floor_ratio"] == round(1_524 / 1_293, 4)
    code, out, _ = run_cli(["sim", "run", "--workers", "200"], capsys)
    assert out.splitlines()[1] == (
        "policy largest-first: 1.18x the floor of 1,293s, set by the quota (quota 1,293s, "
        "workers 613s, retry chain 660s)"
    )


def test_a_killed_run_has_no_floor(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["sim", "run", "--kill-at", "500", "--state", str(tmp_path / "s.json"), "--json"]
    code, out, _ = run_cli(args, capsys)
    doc = json.loads(out)
    assert code == 0 and doc["killed"] and doc["floor"] is None and doc["floor_ratio"] is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["sim", "run", "--policy", "fair"], "use --fairness fair"),
        (["sim", "run", "--policy", "fastest"], "'fastest' is not a policy: use one of book"),
        (["sim", "sweep", "--policy", "book,nope"], "'nope' is not a policy"),
        (["sim", "sweep", "--policy", ","], "give policies like book,largest-first"),
        (["sim", "sweep", "--seeds", "0"], "--seeds: 0 is out of range"),
        (["sim", "run", "--tokens-per-second", "0"], "--tokens-per-second: 0 is out of range"),
        (["sim", "sweep", *SMALL, "--plot", "out.txt"], "--plot: out.txt: give a file ending in"),
        (
            ["sim", "sweep", *SMALL, "--plot", "/nonexistent-dir/sweep.png"],
            "--plot: cannot write /nonexistent-dir/sweep.png",
        ),
    ],
)
def test_bad_policy_options_get_a_clear_error(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(args, capsys)
    assert code == 2
    assert message in err
    assert "Traceback" not in err


def test_fairness_is_its_own_option(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["sim", "run", *SMALL, "--fairness", "fair", "--json"], capsys)
    assert code == 0 and json.loads(out)["state"] == "completed"


def test_sweep_compares_every_policy_against_the_floor(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["sim", "sweep", "--workers", "25,200", "--json"], capsys)
    doc = json.loads(out)
    assert code == 0
    assert doc["n_star"] == 119 and doc["busy_workers"] == 146 and doc["quota_floor_s"] == 1_293
    assert doc["policies"] == ["book", "largest-first", "largest-fit"]
    elapsed = {(r["workers"], r["policy"]): r["elapsed_s"] for r in doc["rows"]}
    assert elapsed == {
        (25, "book"): 5_091,
        (25, "largest-first"): 5_112,
        (25, "largest-fit"): 5_097,
        (200, "book"): 1_604,
        (200, "largest-first"): 1_524,
        (200, "largest-fit"): 1_361,
    }
    floors = {r["workers"]: r["floor_s"] for r in doc["rows"]}
    assert floors == {25: 4_899, 200: 1_293}  # the workers' floor, then the quota's
    code, out, _ = run_cli(["sim", "sweep", "--workers", "25,200"], capsys)
    lines = out.splitlines()
    assert lines[0].split() == ["workers", "book", "largest-first", "largest-fit", "floor", "note"]
    assert lines[2].split()[:7] == [
        "200", "1,604s", "(1.24x)", "1,524s", "(1.18x)", "1,361s", "(1.05x)"
    ]  # fmt: skip
    assert "N* = 119" in out and "146 workers keep the quota busy" in out


def test_sweep_over_seeds_averages_and_lists_every_seed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["sim", "sweep", *SMALL, "--workers", "5,50", "--seeds", "3", "--policy", "book"]
    code, out, _ = run_cli([*args, "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["seeds"] == [0, 1, 2]
    for row in doc["rows"]:
        by_seed = row["elapsed_by_seed"]
        assert len(by_seed) == 3
        assert row["elapsed_s"] == round(sum(by_seed) / 3, 1)
        assert row["elapsed_min_s"] == min(by_seed) and row["elapsed_max_s"] == max(by_seed)
    code, out, _ = run_cli(args, capsys)
    assert out.startswith("mean over seeds 0..2")


def test_sweep_draws_the_picture(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    picture = tmp_path / "sweep.png"
    args = ["sim", "sweep", *SMALL, "--workers", "5,20,80", "--seeds", "2", "--plot", str(picture)]
    code, out, err = run_cli([*args, "--json"], capsys)
    assert code == 0
    assert json.loads(out)["plot"] == str(picture)
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert picture.stat().st_size > 10_000  # lines, labels and a legend, not an empty canvas
    svg = tmp_path / "sweep.svg"
    code, _, err = run_cli(
        ["sim", "sweep", *SMALL, "--workers", "5,20", "--plot", str(svg)], capsys
    )
    assert code == 0 and f"plot written to {svg}" in err
    text = svg.read_text()
    for label in ("book", "largest-first", "largest-fit", "N* = ", "quota floor"):
        assert label in text
