"""What every tier shares: the order its tests start in."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``long`` first, the order otherwise kept. ``make test`` runs the parallel
    tiers that have such tests with ``--maxschedchunk 1`` (one test at a time to each xdist
    worker), so the long tests spread over the workers at the start and a tier ends on short
    ones, not on a long test started last. Measured in the concurrent e2e tier: 7 scenarios of
    155-170 s (each waits out a killed claim's 144 s lease) beside 46 of 0-73 s; in file order it
    ended on two of them. A scenario whose premise depends on what runs beside it is not marked:
    the fairness scenario of tests/e2e/test_20_scheduling.py (73 s), started first beside the kill
    scenarios and the checks, found its backlog half served before the small tenant came."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)
