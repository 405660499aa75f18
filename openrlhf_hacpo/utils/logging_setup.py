"""Logging of a run: the package's INFO messages (resume, save, skipped updates, warnings) go to stderr and are
appended to ``<save_path>/train.log``."""
from __future__ import annotations

import logging
import os
from pathlib import Path

__all__ = ["LOG_FILE", "attach_run_log", "configure_logging"]

LOG_FILE = "train.log"
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_PACKAGE = "openrlhf_hacpo"


def _package_logger() -> logging.Logger:
    logger = logging.getLogger(_PACKAGE)
    logger.setLevel(logging.INFO)
    return logger


def configure_logging(debug: bool = False) -> logging.Handler:
    """Print the package's messages (DEBUG with ``debug``) on stderr; returns the handler (once per process)."""
    logger = _package_logger()
    if debug:
        logger.setLevel(logging.DEBUG)
    for handler in logger.handlers:
        if getattr(handler, "_hacpo_console", False):
            return handler
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(_FORMAT))
    handler._hacpo_console = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    return handler


def attach_run_log(save_path: str | os.PathLike) -> logging.Handler:
    """Append the package's messages to ``<save_path>/train.log``; returns the handler (the caller removes it)."""
    path = Path(save_path) / LOG_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    logger = _package_logger()
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter(_FORMAT))
    logger.addHandler(handler)
    return handler
