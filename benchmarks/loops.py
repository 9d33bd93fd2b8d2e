"""The event loop of a benchmark's processes: uvloop where it is installed (a `--no-uvloop` run keeps the
plain asyncio loop, as the gateway's)."""

from __future__ import annotations


def install_uvloop() -> bool:
    """uvloop as asyncio's event loop from now on, where it is installed; whether it is."""
    try:
        import uvloop  # type: ignore[import-not-found]
    except ImportError:
        return False
    uvloop.install()
    return True
