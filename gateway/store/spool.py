"""The ledger's write-ahead spool: each row goes to a local file before its client's response ends, so a
killed gateway (SIGKILL, the OOM killer) loses no row; the next start replays what the database lacks.

Files: ``<dir>/ledger-<pid>-<ns>-<seq>.jsonl``: a header line ``{"columns": [...]}``, then one JSON array
of those columns' values per row (half the encoding cost of an object), each line one ``os.write`` on an
``O_APPEND`` descriptor (the header goes with the first row), no fsync (the threat is the process dying,
not the machine). A process holds an
exclusive ``flock`` on every segment it owns until it deletes it, so several gateways can share a folder:
a starting one replays only segments whose owner is gone (the kernel drops a dead process's locks). A
segment is created under a temporary name, locked, then renamed, so nobody can take a fresh segment from
under its owner. Rows submitted after the spool is closed go to one small unlocked file each (``-late``), left
for the next start.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import time
from collections.abc import Iterator
from datetime import date, datetime
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

from gateway.core import jsoncodec

log = logging.getLogger("gateway.store.ledger")

PREFIX = "ledger-"
SUFFIX = ".jsonl"
_TMP = ".tmp-"
REJECTED = "rejected.jsonl"  # rows the database refused, kept for a person to look at (never replayed)
MAX_SEALED = 16  # sealed segments awaiting their flush; past this the live segment keeps growing instead


def default_spool_dir(database_url: str) -> Path:
    """``<db stem>-spool`` next to an SQLite file (``.farm/gateway.db`` -> ``.farm/gateway-spool``), else
    ``.farm/gateway-spool``."""
    try:
        u = make_url(database_url)
    except Exception:  # an unparsable URL fails elsewhere, with a better message
        return Path(".farm/gateway-spool")
    db = u.database
    if u.get_backend_name() == "sqlite" and db and db != ":memory:" and not db.startswith("file:"):
        p = Path(db)
        return p.with_name(f"{p.stem}-spool")
    return Path(".farm/gateway-spool")


def _default(o: Any) -> Any:
    if isinstance(o, (datetime, date)):
        return o.isoformat()
    return repr(o)  # a value no column takes: its row is refused at write time anyway


def dumps_row(row: dict | tuple | list) -> bytes:
    """One spool line: a row's values in the header's column order (or a whole object). Datetimes become
    ISO strings (``loads_row`` turns them back)."""
    return jsoncodec.dumps(row, _default) + b"\n"


def header(columns: tuple[str, ...]) -> bytes:
    return dumps_row({"columns": list(columns)})


def loads_row(line: bytes, columns: list[str] | None, datetime_keys: tuple[str, ...]) -> dict | None:
    """A row from a spool line (an array of ``columns``' values, or an object), or None for a line that
    is not one (cut short by a full disk)."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    if isinstance(row, list) and columns is not None and len(row) == len(columns):
        row = dict(zip(columns, row, strict=True))
    if not isinstance(row, dict) or not isinstance(row.get("request_id"), str):
        return None
    for k in datetime_keys:
        v = row.get(k)
        if isinstance(v, str):
            try:
                row[k] = datetime.fromisoformat(v)
            except ValueError:
                return None
    return row


class Segment:
    __slots__ = ("path", "fd", "rows", "seq")

    def __init__(self, path: Path, fd: int, seq: int) -> None:
        self.path = path
        self.fd = fd
        self.rows = 0
        self.seq = seq

    def release(self, delete: bool) -> None:
        """Unlink (when asked) before closing, so the lock covers the file until it is gone."""
        if self.fd < 0:
            return
        if delete:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            except OSError as e:
                log.error("ledger spool: cannot delete %s: %s", self.path, e)
        os.close(self.fd)
        self.fd = -1

    def chunks(self, size: int, datetime_keys: tuple[str, ...]) -> Iterator[tuple[list[dict], int]]:
        """(rows, lines that were not rows) in chunks of ``size`` rows, read from the start of the file."""
        with os.fdopen(os.dup(self.fd), "rb") as f:
            f.seek(0)
            rows: list[dict] = []
            bad = 0
            columns = None
            for line in f:
                if not line.strip():
                    continue
                if columns is None and line.startswith(b'{"columns":'):
                    try:
                        columns = [str(c) for c in json.loads(line)["columns"]]
                        continue
                    except (ValueError, KeyError, TypeError):
                        pass
                row = loads_row(line, columns, datetime_keys)
                if row is None:
                    bad += 1
                    continue
                rows.append(row)
                if len(rows) >= size:
                    yield rows, bad
                    rows, bad = [], 0
            if rows or bad:
                yield rows, bad


def read_rows(path: str | os.PathLike, datetime_keys: tuple[str, ...]) -> list[dict]:
    """Every row of a spool file (for tools and tests; the replay reads in chunks)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return [row for rows, _ in Segment(Path(path), fd, 0).chunks(1 << 30, datetime_keys) for row in rows]
    finally:
        os.close(fd)


def _lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


class Spool:
    """The segments of one process: a live one taking appends and sealed ones waiting for their flush."""

    def __init__(self, directory: str | os.PathLike, header: bytes = b"") -> None:
        self.dir = Path(directory)
        self._header = header  # written with the first row of every segment
        self._tag = f"{os.getpid()}-{time.time_ns():x}"
        self._seq = 0
        self._live: Segment | None = None
        self._sealed: list[Segment] = []
        self._closed = True
        self.keep = False  # never delete this process's segments (rows were shed from memory)

    def open(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._closed = False

    @property
    def segments(self) -> list[Path]:
        live = [self._live.path] if self._live is not None else []
        return [s.path for s in self._sealed] + live

    def _create(self, name: str) -> tuple[Path, int]:
        tmp = self.dir / f"{_TMP}{name}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            path = self.dir / name
            os.rename(tmp, path)
        except BaseException:
            os.close(fd)
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return path, fd

    def append(self, line: bytes) -> None:
        """Write one row's line; raises OSError (the caller keeps the row in memory and counts it)."""
        seg = self._live
        if seg is None:
            if self._closed:
                self._append_late(line)
                return
            self._seq += 1
            path, fd = self._create(f"{PREFIX}{self._tag}-{self._seq:06d}{SUFFIX}")
            seg = self._live = Segment(path, fd, self._seq)
            line = self._header + line
        n = os.write(seg.fd, line)
        seg.rows += 1
        if n != len(line):  # a full disk cut the line short: start a new segment after it
            self._sealed.append(seg)
            self._live = None
            raise OSError(errno.ENOSPC, f"short write to {seg.path} ({n} of {len(line)} bytes)")

    def _append_late(self, line: bytes) -> None:
        self._seq += 1
        path, fd = self._create(f"{PREFIX}{self._tag}-{self._seq:06d}-late{SUFFIX}")
        try:
            os.write(fd, self._header + line)
        finally:
            os.close(fd)
        log.warning("ledger row submitted after the writer stopped: kept in %s for the next start", path)

    def seal(self) -> int:
        """Close the live segment to appends (the next row starts a new one). Returns the mark to pass to
        ``discard`` once every row submitted before this call is in the database."""
        live = self._live
        if live is not None and live.rows and len(self._sealed) < MAX_SEALED:
            self._sealed.append(live)
            self._live = None
        return self._sealed[-1].seq if self._sealed else 0

    def discard(self, mark: int) -> None:
        """Delete the sealed segments up to ``mark``: all their rows are written (or refused)."""
        if self.keep or not self._sealed:
            return
        keep = []
        for seg in self._sealed:
            if seg.seq <= mark:
                seg.release(delete=True)
            else:
                keep.append(seg)
        self._sealed = keep

    def close(self, delete: bool) -> None:
        """Release every segment; ``delete``: every row is in the database, remove the files too (kept
        files are replayed by the next start)."""
        delete = delete and not self.keep
        for seg in [*self._sealed, *([self._live] if self._live is not None else [])]:
            try:
                seg.release(delete=delete)
            except OSError as e:
                log.error("ledger spool: cannot close %s: %s", seg.path, e)
        self._sealed = []
        self._live = None
        self._closed = True

    def claim_orphans(self) -> list[Segment]:
        """Segments in the folder that no live process holds (their owner is gone), each now locked by
        this process, oldest first. Stray temporary files of a dead process (always empty) are removed."""
        mine = set(self.segments)
        found: list[tuple[float, str, Segment]] = []
        try:
            entries = list(os.scandir(self.dir))
        except FileNotFoundError:
            return []
        for entry in entries:
            name = entry.name
            is_tmp = name.startswith(_TMP)
            if not is_tmp and not (name.startswith(PREFIX) and name.endswith(SUFFIX)):
                continue
            path = self.dir / name
            if path in mine:
                continue
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                st = os.fstat(fd)
                if not _lock(fd) or os.fstat(fd).st_nlink == 0:  # held, or deleted by its owner meanwhile
                    os.close(fd)
                    continue
            except OSError:
                os.close(fd)
                raise
            seg = Segment(path, fd, 0)
            if is_tmp:
                seg.release(delete=True)
                continue
            found.append((st.st_mtime, name, seg))
        found.sort(key=lambda t: (t[0], t[1]))
        return [seg for _, _, seg in found]

    def reject(self, line: bytes) -> None:
        """Keep a row the database refused in ``rejected.jsonl`` (best effort)."""
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.dir / REJECTED, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
        except OSError as e:
            log.error("ledger spool: cannot keep a refused row in %s: %s", self.dir / REJECTED, e)
