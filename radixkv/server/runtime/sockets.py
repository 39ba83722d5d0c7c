"""Where the server's processes meet: one `ipc://` path per receiving socket, in a private
directory that the launcher creates and removes.

A server killed with SIGKILL cannot remove its directory, so each directory's name carries its
owner (`radixkv-<pid>-<start time>-<random>`), and a starting server removes the directories of
owners that are gone.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

logger = logging.getLogger(__name__)
PREFIX = "radixkv-"
OWNERLESS_MAX_AGE_S = 24 * 3600  # a directory from before owners were recorded: stale after a day


def _start_time(pid: int) -> int | None:
    """When process `pid` started (centiseconds since the epoch), or None if there is none."""
    try:
        return round(psutil.Process(pid).create_time() * 100)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


@dataclass(frozen=True)
class Endpoints:
    """ZMQ addresses; each is bound by the process that receives on it."""

    directory: str
    scheduler: str  # PULL in the scheduler process
    detokenizer: str  # PULL in the detokenizer process
    tokenizer: str  # PULL in the HTTP process (tokenizer manager)

    @classmethod
    def create(cls) -> Endpoints:
        remove_stale()
        pid = os.getpid()
        directory = tempfile.mkdtemp(prefix=f"{PREFIX}{pid}-{_start_time(pid)}-")
        os.chmod(directory, 0o700)  # other users cannot connect
        return cls(directory, *(f"ipc://{os.path.join(directory, name)}"
                                for name in ("scheduler", "detokenizer", "tokenizer")))

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def is_stale(directory: Path) -> bool:
    """Whether the server that made `directory` is gone (its pid dead, or now another process)."""
    parts = directory.name[len(PREFIX):].split("-")
    if len(parts) < 3 or not parts[0].isdigit() or not parts[1].isdigit():
        try:  # a name without its owner
            return time.time() - directory.stat().st_mtime > OWNERLESS_MAX_AGE_S
        except OSError:
            return False
    return _start_time(int(parts[0])) != int(parts[1])


def remove_stale(root: str | None = None) -> list[str]:
    """Remove this user's socket directories whose server is gone; the ones removed."""
    removed = []
    base = Path(root or tempfile.gettempdir())
    try:
        candidates = [p for p in base.iterdir() if p.name.startswith(PREFIX) and p.is_dir()]
    except OSError:
        return removed
    for directory in candidates:
        try:
            if directory.stat().st_uid != os.getuid() or not is_stale(directory):
                continue
        except OSError:
            continue
        shutil.rmtree(directory, ignore_errors=True)
        removed.append(str(directory))
    if removed:
        logger.info("removed %d socket director%s left by servers that were killed: %s", len(removed),
                    "y" if len(removed) == 1 else "ies", ", ".join(removed))
    return removed
