"""Ports for the AWS services the control plane uses beyond the governor and the ledger."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from swarm.core.lanes import QueuedUnit
from swarm.core.records import Lane


@dataclass(frozen=True)
class LaneDepth:
    visible: int  # waiting to be received
    in_flight: int  # received by a worker, not yet deleted
    delayed: int  # sent with a delay (backpressure returns), not yet visible

    @property
    def queued(self) -> int:
        return self.visible + self.delayed


#: SQS's longest DelaySeconds: a requeued unit comes back after at most this long
MAX_SQS_DELAY_S = 900


class LaneQueue(Protocol):
    """The SQS lanes (one queue per lane, each with its DLQ)."""

    def send(self, item: QueuedUnit, delay_s: int = 0) -> None: ...

    def depths(self) -> Mapping[Lane, LaneDepth]: ...


class BlobStore(Protocol):
    """The manifest/results bucket."""

    def put_json(self, key: str, doc: Any) -> None: ...

    def get_json(self, key: str) -> Any:
        """Raises NotFound when there is no such object, ReadDenied when the store will not say
        (S3's 403), InvalidInput (named by the key) when it is not JSON."""
        ...

    def exists(self, key: str) -> bool:
        """Raises ReadDenied when the store will not say (never reads a 403 as "no")."""
        ...


class Executions(Protocol):
    """The fan-out state machine."""

    def start(self, name: str, payload: Mapping[str, Any]) -> bool:
        """Start an execution; False (and nothing new) if one with this name already exists."""
        ...


class DrainSwitch(Protocol):
    """The drain parameter in SSM Parameter Store."""

    def draining(self, fresh: bool = False) -> bool:
        """``fresh`` bypasses any cache (the worker's check must be exact)."""
        ...

    def set(self, draining: bool) -> None: ...


class Events(Protocol):
    """EventBridge."""

    def publish(self, detail_type: str, detail: Mapping[str, Any]) -> None: ...


@dataclass(frozen=True)
class MappingState:
    lane: Lane
    uuid: str
    state: str  # Enabled | Disabled | Enabling | Disabling | ...

    @property
    def enabled(self) -> bool:
        return self.state in ("Enabled", "Enabling")


class Mappings(Protocol):
    """The workers' SQS event source mappings, one per lane."""

    def set_enabled(self, enabled: bool) -> list[MappingState]: ...

    def states(self) -> list[MappingState]: ...
