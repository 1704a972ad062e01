"""Files a kill cannot leave half-written: each is written to a temporary file, synced, renamed into place, and its
directory synced, so a crash at any moment leaves the previous file whole (or none)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch


def write_atomic(path: Path, write: Callable[[IO[bytes]], Any]) -> None:
    """Call write(f) on a temporary file beside `path`, sync it, rename it to `path` and sync the directory."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    directory = os.open(path.parent, os.O_RDONLY)  # the rename survives a crash once the directory is synced
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def save_atomic(value: Any, path: Path) -> None:
    """torch.save, atomically."""
    write_atomic(path, lambda f: torch.save(value, f))


def write_json_atomic(value: Any, path: Path) -> None:
    write_atomic(path, lambda f: f.write(json.dumps(value, indent=2).encode()))


def read_json(path: Path) -> dict | None:
    """A JSON object from `path`, or None when it is missing or unreadable (e.g. cut short by a kill)."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None
