"""Loading a model's Hugging Face tokenizer, without torch where it was loaded before.

`AutoTokenizer` decides which tokenizer class a model directory needs (from its
`tokenizer_config.json`, its `config.json`'s model type and transformers' own table of
exceptions), and to read the model type it imports transformers' configuration code, which
imports torch: 1.4 s of a process that only tokenizes (the HTTP server, the detokenizer), on every
start. The class it decides on is all that matters: every one of its paths ends in
`that_class.from_pretrained(directory)`. So the first load of a directory goes through
`AutoTokenizer` and records the class's name (`<cache>/tokenizers/<digest>.json`, the digest of
the directory's path, the tokenizer files' sizes and modification times, and transformers'
version); a later load of the unchanged directory calls that class directly. A class that is not
transformers' own (remote code) is never recorded.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from radixkv.cache_dirs import cache_root

logger = logging.getLogger(__name__)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json", "config.json",
                   "added_tokens.json")
"""What `AutoTokenizer`'s choice of class, or the tokenizer itself, is read from."""


def _record_path(model_dir: Path) -> Path:
    import transformers

    h = hashlib.sha256(f"{transformers.__version__}\0{model_dir.resolve()}\0".encode())
    for name in TOKENIZER_FILES:
        try:
            st = (model_dir / name).stat()
        except OSError:
            continue
        h.update(f"{name}:{st.st_size}:{st.st_mtime_ns}\0".encode())
    return cache_root() / "tokenizers" / f"{h.hexdigest()[:32]}.json"


def _recorded_class(record: Path) -> Any | None:
    """The tokenizer class recorded for this directory, if any and if transformers still has it."""
    try:
        name = json.loads(record.read_text())["class"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    import transformers

    cls = getattr(transformers, name, None) if isinstance(name, str) else None
    return cls if isinstance(cls, type) and hasattr(cls, "from_pretrained") else None


def _record(record: Path, cls: type) -> None:
    """Remember `cls` for this directory (atomically; a failure only costs the next start time)."""
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=record.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"class": cls.__name__}, f)
        os.replace(tmp, record)
    except OSError as e:
        logger.debug("tokenizer class not recorded at %s: %s", record, e)


def load_hf_tokenizer(model_dir: str | Path):
    """The tokenizer `AutoTokenizer.from_pretrained(model_dir, local_files_only=True)` gives,
    through the class recorded for this directory when there is one. Raises what they raise."""
    model_dir = Path(model_dir)
    record = _record_path(model_dir) if model_dir.is_dir() else None  # a hub name: no files to key on
    cls = _recorded_class(record) if record is not None else None
    if cls is not None:
        return cls.from_pretrained(str(model_dir), local_files_only=True)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    import transformers

    if record is not None and getattr(transformers, type(tokenizer).__name__, None) is type(tokenizer):
        _record(record, type(tokenizer))  # transformers' own class, not remote code
    return tokenizer
