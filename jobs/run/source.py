"""Which kernel code a job measures: the git commit of kernels/, and the state of its uncommitted changes
(the code itself travels with a submitted job: cluster.shipping).

No Ray, no store: `farm submit` and the runner both use it.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

KERNELS = Path(__file__).resolve().parents[2] / "kernels"


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(KERNELS), *args], capture_output=True, text=True, timeout=10, check=True
    ).stdout.strip()


def kernels_commit() -> str | None:
    """The git commit of the kernels being measured, with `+dirty` when the tree has changes."""
    try:
        sha = _git("rev-parse", "HEAD")
        dirty = _git("status", "--porcelain", "--", ".")
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("+dirty" if dirty else "")


def kernels_source() -> str | None:
    """The commit and, when kernels/ has uncommitted changes, a hash of them (`<sha>+dirty:<12 hex>`):
    two submissions from one tree state carry the same source, an edit between them does not."""
    commit = kernels_commit()
    if commit is None or not commit.endswith("+dirty"):
        return commit
    try:
        diff = _git("diff", "HEAD", "--", ".") + _git("ls-files", "--others", "--exclude-standard", "--", ".")
    except (OSError, subprocess.SubprocessError):
        return commit
    return f"{commit}:{hashlib.sha256(diff.encode()).hexdigest()[:12]}"
