"""Where the server's processes meet: one `ipc://` path per receiving socket, in a private
directory that the launcher creates and removes."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass


@dataclass(frozen=True)
class Endpoints:
    """ZMQ addresses; each is bound by the process that receives on it."""

    directory: str
    scheduler: str  # PULL in the scheduler process
    detokenizer: str  # PULL in the detokenizer process
    tokenizer: str  # PULL in the HTTP process (tokenizer manager)

    @classmethod
    def create(cls) -> Endpoints:
        directory = tempfile.mkdtemp(prefix="radixkv-")
        os.chmod(directory, 0o700)  # other users cannot connect
        return cls(directory, *(f"ipc://{os.path.join(directory, name)}"
                                for name in ("scheduler", "detokenizer", "tokenizer")))

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)
