"""Files written whole or not at all (standard library only)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all, through a temporary file renamed over it: a reader
    polling for it (``swarm local up`` waits for the local stack's ``local.json``) never sees
    an empty or half-written file, and a crash mid-write leaves the previous one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
