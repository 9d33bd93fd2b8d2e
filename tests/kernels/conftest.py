"""What the kernel tests share: running a script with the Triton JIT instead of the interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest


def _run_compiled(script: str, *args: str, timeout: float = 900, interpret: str | None = None) -> Any:
    """Run `script` in a subprocess with TRITON_INTERPRET unset (or set to `interpret`, e.g. "0": compile
    even without a GPU), assert it exited 0 and return its last stdout line parsed as JSON."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret is not None:
        env["TRITON_INTERPRET"] = interpret
    proc = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def run_compiled() -> Callable[..., Any]:
    """`_run_compiled`: the test session runs Triton in the interpreter, so compiled runs are subprocesses."""
    return _run_compiled
