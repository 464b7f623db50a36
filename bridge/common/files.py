"""Atomic, durable file writes: a reader sees the old file or the new one, never a mix, and a write
that returned survives a power cut.

    write_atomic(path, b"...")                 # bytes, mode 0o600 by default
    write_json(path, {"a": 1})                 # JSON text, same guarantees
    fsync_dir(folder)                          # a rename/new entry in `folder` made durable
    with staged_dir("out/dataset") as tmp: ...   # a folder built whole beside it, renamed into place
    with staged_file("out/run.mcap") as tmp: ... # a file some writer fills, renamed into place
                                                 # (what a killed writer left is swept by the next one)

How: a temp file in the same folder (so the rename is atomic), written and fsynced, renamed over
`path`, then the folder fsynced (so the rename itself is on disk). On any error the temp is removed
and the old file is left as it was.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> write_json(d / "sub" / "x.json", {"b": 1, "a": 2}, indent=None, sort_keys=True)
    >>> (d / "sub" / "x.json").read_text()
    '{"a": 2, "b": 1}\\n'
    >>> sorted(p.name for p in (d / "sub").iterdir())   # no temp file left behind
    ['x.json']
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["fsync_dir", "read_ascii", "write_atomic", "write_json", "write_text"]


def fsync_dir(path: str | os.PathLike) -> None:
    """Make the entries of folder `path` (a rename, a new file) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike, data: bytes, *, mode: int = 0o600, durable: bool = True) -> None:
    """Replace `path` by `data` atomically (and, with `durable`, fsynced file and folder).

    The folder is created if missing. `mode` is the new file's permission bits (0o600: owner only).
    `durable=False` skips both fsyncs, for files that are cheap to lose (a status snapshot).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(path.parent)


def write_text(path: str | os.PathLike, text: str, *, mode: int = 0o644, durable: bool = True) -> None:
    """`write_atomic` of UTF-8 text (mode 0o644 by default: text files others may read)."""
    write_atomic(path, text.encode(), mode=mode, durable=durable)


def write_json(path: str | os.PathLike, data: Any, *, indent: int | None = 2, sort_keys: bool = False,
               mode: int = 0o644, durable: bool = True) -> None:
    """`data` as JSON (with a trailing newline) into `path`, atomically and durably."""
    text = json.dumps(data, indent=indent, sort_keys=sort_keys) + "\n"
    write_atomic(path, text.encode(), mode=mode, durable=durable)


def _staging_prefix(path: Path) -> str:
    return f".{path.name}.staging-{os.getpid()}-"


def _sweep_stale(path: Path) -> None:
    """Removes what a staged write to `path` left when its process was killed (kill -9, power cut): the temp
    siblings of processes no longer running."""
    import shutil

    for old in path.parent.glob(f".{glob.escape(path.name)}.staging-*-*.tmp"):
        try:
            pid = int(old.name[len(path.name) + 10:].split("-", 1)[0])
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink(missing_ok=True)
        except (ValueError, PermissionError):
            continue


@contextlib.contextmanager
def staged_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yields an empty sibling temp folder of `path`; when the block ends without error it is renamed to
    `path` (which must not exist, or be an empty folder), else removed: `path` is never left half-written.
    FileExistsError before anything is written when `path` holds something."""
    import shutil

    path = Path(path)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise FileExistsError(f"{path}: exists and is not an empty directory")
    path.parent.mkdir(parents=True, exist_ok=True)
    _sweep_stale(path)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=_staging_prefix(path), suffix=".tmp"))
    try:
        yield tmp
        if path.exists():
            path.rmdir()
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(path.parent)


@contextlib.contextmanager
def staged_file(path: str | os.PathLike, *, overwrite: bool = False) -> Iterator[Path]:
    """Yields a sibling temp path for a writer to fill; renamed over `path` when the block ends without error,
    else removed. FileExistsError up front if `path` exists and not `overwrite`."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path}: exists")
    path.parent.mkdir(parents=True, exist_ok=True)
    _sweep_stale(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=_staging_prefix(path), suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def read_ascii(path: str | os.PathLike, *, what: str) -> str:
    """A small ASCII file's text, surrounding whitespace stripped (a secret, a run id); ValueError naming the file and
    why, never its content: `read_ascii("lab/triton.secret", what="Triton secret")`."""
    try:
        return Path(path).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the {what} file {str(path)!r}: "
                         f"{exc.strerror if isinstance(exc, OSError) else 'not ASCII'}") from None
