"""The local function host keeps each Powertools logger's keys per invocation (thread).

Powertools keeps a logger's keys on a formatter shared by every logger of one service name; the
local stack runs every function's sandboxes in one process, so concurrent invocations wrote
each other's keys into their lines. These tests run two "invocations" on two threads at once.
"""

from __future__ import annotations

import io
import json
import logging
import threading

from aws_lambda_powertools import Logger

from swarm.local.functions import keep_log_keys_per_invocation


def _two_concurrent_invocations(service: str) -> list[dict[str, object]]:
    out = io.StringIO()
    # one formatter for the service, as every sandbox's logger of that service shares
    logger = Logger(service=service, logger_handler=logging.StreamHandler(out))
    both_keyed = threading.Barrier(2)

    def invocation(unit: str) -> None:
        logger.append_keys(unit_id=unit)
        both_keyed.wait(timeout=10)  # each has set its key before either logs
        logger.info("unit processed")

    threads = [threading.Thread(target=invocation, args=(unit,)) for unit in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_concurrent_invocations_log_their_own_keys() -> None:
    keep_log_keys_per_invocation()
    lines = _two_concurrent_invocations("swarm-test-log-keys")
    assert sorted(str(line["unit_id"]) for line in lines) == ["a", "b"]
    # and each line keeps the service's own keys
    assert {line["service"] for line in lines} == {"swarm-test-log-keys"}


def test_a_later_invocation_on_another_thread_starts_from_the_formatters_own_keys() -> None:
    keep_log_keys_per_invocation()
    out = io.StringIO()
    logger = Logger(service="swarm-test-log-fresh", logger_handler=logging.StreamHandler(out))
    keyed = threading.Thread(target=logger.append_keys, kwargs={"unit_id": "a"})
    keyed.start()
    keyed.join(timeout=10)
    later = threading.Thread(target=logger.info, args=("next invocation",))
    later.start()
    later.join(timeout=10)
    line = json.loads(out.getvalue())
    assert "unit_id" not in line and line["service"] == "swarm-test-log-fresh"
