"""A watchdog over the local stack's process, for reading a stall after the fact.

The local stack is one Python process: every function, the emulator and the API share its cores
and its GIL. When a request to its API waits past a client's timeout, the question is what the
process was doing. The watchdog answers it in the stack's log:

- ``process stalled``: its own one-second sleep overran by ``stall_s`` or more (the whole
  process, or the GIL, was held: nothing else ran either);
- ``request in flight``: an API request has waited and run for ``request_s`` or more, logged once
  per request with every thread's stack at that moment (identical stacks counted once), so a
  lock held too long, or a deadlock, is named by the frames that hold and wait for it.

It never changes what the stack does.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Iterator

log = logging.getLogger("swarm.local")

#: frames kept per thread stack (the innermost)
STACK_FRAMES = 12


def thread_stacks(frames: int = STACK_FRAMES) -> str:
    """Every thread's stack, innermost ``frames`` frames, identical stacks counted once."""
    names = {t.ident: t.name for t in threading.enumerate()}
    seen: Counter[str] = Counter()
    first_name: dict[str, str] = {}
    for ident, frame in sys._current_frames().items():
        text = "".join(traceback.format_stack(frame)[-frames:])
        seen[text] += 1
        first_name.setdefault(text, names.get(ident, str(ident)))
    parts = [
        f"-- {n} thread(s), e.g. {first_name[text]}:\n{text}" for text, n in seen.most_common()
    ]
    return "".join(parts)


class Watchdog:
    def __init__(self, period_s: float = 1.0, stall_s: float = 5.0, request_s: float = 30.0):
        self.period_s = period_s
        self.stall_s = stall_s
        self.request_s = request_s
        self._lock = threading.Lock()
        #: per in-flight request: (its line, when it started, reported yet)
        self._inflight: dict[int, tuple[str, float, bool]] = {}
        self._ids = itertools.count()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="local-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    @contextlib.contextmanager
    def request(self, line: str) -> Iterator[None]:
        """Watch one API request (``METHOD path``) while it is in flight."""
        key = next(self._ids)
        with self._lock:
            self._inflight[key] = (line, time.monotonic(), False)
        try:
            yield
        finally:
            with self._lock:
                self._inflight.pop(key, None)

    def check(self, late_s: float, now: float) -> None:
        """One round: log a stall of ``late_s`` and the requests in flight too long."""
        if late_s >= self.stall_s:
            log.warning("process stalled %s", json.dumps({"late_s": round(late_s, 1)}))
        overdue: list[tuple[str, float]] = []
        with self._lock:
            for key, (line, started, reported) in self._inflight.items():
                if not reported and now - started >= self.request_s:
                    self._inflight[key] = (line, started, True)
                    overdue.append((line, now - started))
        if overdue:
            doc = {"requests": [{"request": r, "for_s": round(s, 1)} for r, s in overdue]}
            log.warning("request in flight %s\n%s", json.dumps(doc), thread_stacks())

    def _run(self) -> None:
        while not self._stop.is_set():
            before = time.monotonic()
            self._stop.wait(self.period_s)
            now = time.monotonic()
            self.check(now - before - self.period_s, now)
