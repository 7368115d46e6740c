"""An embedded moto server: a background thread of the current process, patched, on a free
localhost port. Workers in other processes reach it over HTTP, like a real fleet."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from swarm.local.patches import apply_all


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class EmbeddedServer:
    """A running moto server; ``endpoint`` is what boto3's ``endpoint_url`` takes."""

    endpoint: str
    _server: Any

    def stop(self) -> None:
        self._server.stop()


def start_server(
    host: str = "127.0.0.1", port: int | None = None, patch: bool = True
) -> EmbeddedServer:
    """Start a moto server in a daemon thread of this process, patched unless ``patch=False``.

    The patch is process-wide, so it covers the server's request threads too. Stop it with
    :meth:`EmbeddedServer.stop`.
    """
    from moto.server import ThreadedMotoServer

    if patch:
        apply_all()
    # werkzeug logs every request to stderr: thousands of lines per benchmark second
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = free_port(host) if port is None else port
    server = ThreadedMotoServer(ip_address=host, port=port, verbose=False)
    server.start()
    return EmbeddedServer(endpoint=f"http://{host}:{port}", _server=server)


@contextmanager
def running_server(patch: bool = True) -> Iterator[EmbeddedServer]:
    server = start_server(patch=patch)
    try:
        yield server
    finally:
        server.stop()
