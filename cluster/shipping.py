"""Kernel source shipped with a submitted job: kernels/ as the submitter's working tree has it, packed into a
zip named by its content, stored with the job (jobs.queue), and loaded by the pool's worker that runs the
job's trials (cluster.worker), on whichever node it is.

Why not Ray's runtime environment: Ray takes a local folder (``py_modules``, ``working_dir``) only for a whole
Ray job (``ray.init``, job submission); an actor's own runtime environment takes only a remote URI (S3, GCS,
HTTPS). One pool serves the trials of many jobs, each possibly of a different source, from one Ray job, so the
archive goes to the worker as an argument (Ray's object store moves it to the worker's node) and the worker
puts it first on its import path before anything imports ``kernels``.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KERNELS = Path(__file__).resolve().parents[1] / "kernels"
MAX_PACKED_BYTES = 32 * 1024 * 1024  # a kernels/ tree past this (data files added by mistake) is refused


@dataclass(frozen=True)
class PackedSource:
    """kernels/ as the submitter's working tree has it (every file git tracks or would track: uncommitted
    edits and new files included, ignored ones not), as a zip; `digest` names its content (file paths
    and bytes), so the same tree packed twice, on any machine, has the same digest."""

    digest: str
    archive: bytes
    files: int


def _tree_files(root: Path) -> list[Path]:
    """The files of `root` git would commit (tracked or untracked-not-ignored, not deleted); without git,
    every file but caches."""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True, timeout=10, check=True,
        ).stdout  # fmt: skip
        names = [n for n in out.decode().split("\0") if n]
        return sorted(p for p in (root / n for n in names) if p.is_file())
    except (OSError, subprocess.SubprocessError):
        return sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def pack_kernels(root: Path = KERNELS) -> PackedSource:
    """kernels/ packed for shipping (see PackedSource); ValueError past MAX_PACKED_BYTES, naming the
    largest files."""
    files = _tree_files(root)
    size = sum(p.stat().st_size for p in files)
    if size > MAX_PACKED_BYTES:
        biggest = sorted(files, key=lambda p: p.stat().st_size, reverse=True)[:3]
        raise ValueError(
            f"{root} holds {size / 2**20:.0f} MiB of files, over the {MAX_PACKED_BYTES >> 20} MiB a "
            "submitted job ships; the largest: " + ", ".join(str(p.relative_to(root)) for p in biggest)
        )
    digest = hashlib.sha256()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for rel, data in _contents(root, files, digest):
            info = zipfile.ZipInfo(f"kernels/{rel}", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            z.writestr(info, data, zipfile.ZIP_DEFLATED)
    return PackedSource(digest.hexdigest(), buf.getvalue(), len(files))


def _contents(root: Path, files: list[Path], digest: Any) -> Iterator[tuple[str, bytes]]:
    """Each file's path under `root` and bytes, each added to `digest` as the source's digest names them."""
    for p in files:
        rel = p.relative_to(root).as_posix()
        data = p.read_bytes()
        digest.update(f"{rel}\0{len(data)}\0".encode())
        digest.update(data)
        yield rel, data


def source_digest(root: Path = KERNELS) -> str:
    """The digest of kernels/ as pack_kernels names it, without packing it: what a worker running the
    cluster's own kernels/ records as its kernel source (cluster.environment), equal to a shipped source's
    digest for the same files."""
    digest = hashlib.sha256()
    for _ in _contents(root, _tree_files(root), digest):
        pass
    return digest.hexdigest()


def unpack_kernels(digest: str, archive: bytes, under: Path) -> Path:
    """Extract a packed kernels/ under `under/<digest>/` once (a later call finds it there); returns the
    folder that holds `kernels/`, to put first on sys.path. The archive's names are checked: nothing is
    written outside that folder."""
    target = under / digest
    if (target / "kernels" / "__init__.py").is_file():
        return target
    under.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{digest[:12]}-", dir=under))
    try:
        with zipfile.ZipFile(io.BytesIO(archive)) as z:
            for name in z.namelist():
                parts = Path(name).parts
                if not parts or parts[0] != "kernels" or ".." in parts or Path(name).is_absolute():
                    raise ValueError(f"packed kernel source {digest[:12]}: unexpected member {name!r}")
            z.extractall(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        os.rename(tmp, target)  # atomic: two workers extracting at once leave one whole copy
    except OSError:  # the other one won
        shutil.rmtree(tmp, ignore_errors=True)
    return target
