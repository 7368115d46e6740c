"""Writes to the emulator's state that the local stack's pollers follow, without polling it.

Lambda's SQS pollers follow their event source mapping (the drain controller flips ``Enabled``)
and EventBridge's rule follows the drain parameter. Locally each was an HTTP request to the
in-process emulator, every 0.5 s per mapping and every 0.25 s for the parameter: with the
pollers' idle long polls, 22% of a core for a stack doing nothing (measured: 6.7 s of CPU in
30 s). moto's backends bump a version per kind of state when it is written
(:func:`swarm.local.patches.emulator.patch_change_signals`), and the pollers wait for a bump,
then read the state as before, through the emulator's API.
"""

from __future__ import annotations

import threading

#: event source mappings created, updated or deleted
MAPPINGS = "event-source-mappings"
#: Parameter Store parameters put, labelled or deleted
PARAMETERS = "parameters"


class Changes:
    """A version per kind of state, bumped by each write; waited on by the pollers."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._versions: dict[str, int] = {}
        #: the emulator's backends bump (the patch is applied): without it nothing would
        self.signalled = False

    def bump(self, kind: str) -> None:
        with self._cond:
            self._versions[kind] = self._versions.get(kind, 0) + 1
            self._cond.notify_all()

    def version(self, kind: str) -> int:
        with self._cond:
            return self._versions.get(kind, 0)

    def wait(self, kind: str, seen: int, timeout_s: float) -> int:
        """``kind``'s version, once it differs from ``seen`` or after ``timeout_s``."""
        with self._cond:
            self._cond.wait_for(lambda: self._versions.get(kind, 0) != seen, timeout_s)
            return self._versions.get(kind, 0)

    def require(self) -> None:
        """Fail loudly where a poller would otherwise never see a change."""
        if not self.signalled:
            raise RuntimeError(
                "the emulator does not signal its changes: apply "
                "swarm.local.patches.emulator.patch_change_signals() before starting a poller"
            )


#: the process's (the emulator runs in it)
CHANGES = Changes()
