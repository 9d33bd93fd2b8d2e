"""Kernel families by name, and the plugins that extend them.

A family is imported only when a spec or a worker asks for it. `FARM_PLUGINS` (comma-separated module
names) names modules imported before the first family is handed out, in every process that asks for one
(the farm's driver and its Ray workers alike, which inherit the variable): a plugin registers families of
its own with `register_family` (an out-of-tree family), or with `extend` hands a function the family when
it is first handed out, to change how its backends run (`Backends.wrap`, kernels.base; the test suite's
fault-injecting backends, testkit.kernels.faults), so a plugin imports no family a process does not use.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kernels.base import Family

PLUGINS_ENV = "FARM_PLUGINS"

# name -> module holding FAMILY
FAMILIES: dict[str, str] = {
    "attention": "kernels.attention.case",
    "fp8_gemm": "kernels.fp8_gemm.case",
    "gemm": "kernels.gemm.case",
    "paged_mla": "kernels.paged_mla.case",
    "probe": "kernels.probe.case",
}


# family name -> functions still to run on it, and the families they ran on
_EXTENSIONS: dict[str, list[Callable[[Family], None]]] = {}
_EXTENDED: set[str] = set()


class UnknownFamily(KeyError):
    def __str__(self) -> str:
        return f"unknown kernel family {self.args[0]!r} (known: {', '.join(sorted(FAMILIES))})"


class PluginError(ValueError):
    """A module FARM_PLUGINS names cannot be imported."""


def register_family(name: str, module: str) -> None:
    """Make family `name` (the module holding its FAMILY) known: what a plugin calls for its own family."""
    known = FAMILIES.get(name)
    if known is not None and known != module:
        raise ValueError(f"kernel family {name!r} is already {known}; {module} cannot take its name")
    FAMILIES[name] = module


def extend(name: str, fn: Callable[[Family], None]) -> None:
    """Run `fn(family)` once on family `name` before it is first handed out (at once if it already was)."""
    _EXTENSIONS.setdefault(name, []).append(fn)
    if name in _EXTENDED:
        get_family(name)


def load_plugins() -> list[str]:
    """Import the modules FARM_PLUGINS names (each once per process); the names, in order."""
    names = [n.strip() for n in os.environ.get(PLUGINS_ENV, "").split(",") if n.strip()]
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise PluginError(f"{PLUGINS_ENV}: cannot import {name!r} ({e})") from e
    return names


def get_family(name: str) -> Family:
    load_plugins()
    try:
        module = FAMILIES[name]
    except KeyError:
        raise UnknownFamily(name) from None
    family = importlib.import_module(module).FAMILY
    _EXTENDED.add(name)
    pending = _EXTENSIONS.get(name, [])
    while pending:
        pending.pop(0)(family)
    return family


def point_config(family: str, backend: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """A trial's config as the point it measured: without its backend's variant keys
    (kernels.base.Backend.variant_keys); the whole config for a family this process does not know."""
    try:
        return get_family(family).point_config(backend, config)
    except UnknownFamily:
        return dict(config)
