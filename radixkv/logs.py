"""Logging set-up: one structured line per event, level chosen by `--log-level`."""

from __future__ import annotations

import logging

FORMAT = "%(asctime)s %(levelname)-7s %(name)s [pid %(process)d]: %(message)s"


def setup_logging(level: str = "info") -> None:
    """Configure the `radixkv` logger once; later calls only change its level."""
    logger = logging.getLogger("radixkv")
    logger.setLevel(level.upper())
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(FORMAT, datefmt="%Y-%m-%dT%H:%M:%S"))
        logger.addHandler(handler)
        logger.propagate = False
