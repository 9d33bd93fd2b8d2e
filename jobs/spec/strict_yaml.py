"""YAML as yaml.safe_load reads it, except that a key given twice in one mapping is an error; read with
libyaml (PyYAML's C parser) whenever PyYAML has it.

PyYAML keeps the last of two equal keys silently, so a typo'd spec would run something else than it says.
The check needs the key's line, which only the parse has. Composing a node tree and constructing it (what
``yaml.load`` does) costs, for a spec of 10^6 grid values, 40 s and 840 MB with PyYAML's pure-Python
loader and still 6 s and 460 MB with the C one (a Python node and two marks per value). So the document
is built here from libyaml's events as they come: no tree is held, each scalar is resolved and
constructed by the safe loader's own resolver and constructors (the same YAML 1.1 types), and a mapping
checks its keys as it goes. A document with anchors, aliases, explicit tags or complex keys (rare in a
spec) is read through the node tree instead, by the C loader with the same check
(benchmarks/spec_bench.py measures both).
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.events import (
    DocumentEndEvent,
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
    StreamEndEvent,
)
from yaml.nodes import ScalarNode

__all__ = ["DuplicateKey", "load_strict"]

_C = getattr(yaml, "CSafeLoader", None)  # None: PyYAML built without libyaml
_STR = "tag:yaml.org,2002:str"
_MERGE, _VALUE = "tag:yaml.org,2002:merge", "tag:yaml.org,2002:value"
_KEY_TYPES = (str, int, float, bool)


class DuplicateKey(yaml.MarkedYAMLError):
    """A key given twice in one mapping: ``problem`` names it and its first line, ``problem_mark`` is the
    second."""


def _duplicate(key: Any, first_line: int, mark: Any) -> DuplicateKey:
    return DuplicateKey(problem=f"duplicate key {key!r} (first on line {first_line})", problem_mark=mark)


class _UniqueKeyLoader(_C or yaml.SafeLoader):  # type: ignore[misc]
    """The node-tree path: the safe loader (C when present) that refuses a key given twice."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag in (_MERGE, _VALUE):  # `<<: *base` (its keys are overridden, not repeated)
                continue
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, _KEY_TYPES):
                if key in seen:
                    raise _duplicate(key, seen[key], key_node.start_mark)
                seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


class _NeedsTree(Exception):
    """The document uses what the event path leaves to the node tree (anchors, aliases, tags, ...)."""


def load_strict(text: str) -> Any:
    """The one document in ``text`` (None when there is none), as yaml.safe_load gives it; a key given
    twice in a mapping raises DuplicateKey; bad YAML raises PyYAML's error with its mark."""
    if _C is not None:
        try:
            return _Events(text).document()
        except _NeedsTree:
            pass
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader (or CSafeLoader) subclass


class _Events:
    """One document built from libyaml's event stream (the loader's resolver and constructors used for
    scalars, nothing composed)."""

    def __init__(self, text: str) -> None:
        self.loader = _C(text)
        self.get = self.loader.get_event
        self.resolve = self.loader.resolve
        self.constructors = self.loader.yaml_constructors

    def document(self) -> Any:
        try:
            self.get()  # StreamStartEvent
            event = self.get()
            if isinstance(event, StreamEndEvent):
                return None
            data = self.node(self.get())  # after DocumentStartEvent
            if not isinstance(self.get(), DocumentEndEvent) or not isinstance(self.get(), StreamEndEvent):
                raise _NeedsTree  # more than one document: the tree path raises yaml.load's own error
            return data
        finally:
            self.loader.dispose()

    def scalar(self, event: ScalarEvent) -> Any:
        if event.anchor is not None or (event.tag is not None and event.tag != "!"):
            raise _NeedsTree
        value = event.value
        plain = event.implicit[0]
        if plain and value.isdigit() and value.isascii() and (value[0] != "0" or len(value) == 1):
            return int(value)  # the common case, as the int resolver and constructor would give it
        if not plain and event.implicit[1]:
            return value  # quoted: a string
        tag = self.resolve(ScalarNode, value, event.implicit)
        if tag == _STR:
            return value
        if tag not in self.constructors:
            raise _NeedsTree
        node = ScalarNode(tag, value, event.start_mark, event.end_mark, style=event.style)
        return self.constructors[tag](self.loader, node)

    def node(self, event: Any) -> Any:
        kind = type(event)
        if kind is ScalarEvent:
            return self.scalar(event)
        if kind is SequenceStartEvent:
            return self.sequence(event)
        if kind is MappingStartEvent:
            return self.mapping(event)
        raise _NeedsTree  # an alias

    def sequence(self, start: SequenceStartEvent) -> list[Any]:
        if start.anchor is not None or not start.implicit:
            raise _NeedsTree
        out: list[Any] = []
        append, get, scalar = out.append, self.get, self.scalar
        while True:
            event = get()
            kind = type(event)
            if kind is ScalarEvent:
                append(scalar(event))
            elif kind is SequenceEndEvent:
                return out
            else:
                append(self.node(event))

    def mapping(self, start: MappingStartEvent) -> dict[Any, Any]:
        if start.anchor is not None or not start.implicit:
            raise _NeedsTree
        out: dict[Any, Any] = {}
        seen: dict[Any, int] = {}
        get = self.get
        while True:
            event = get()
            kind = type(event)
            if kind is MappingEndEvent:
                return out
            if kind is not ScalarEvent:
                raise _NeedsTree  # a complex key (a sequence or mapping), or an alias
            if event.implicit[0] and event.value in ("<<", "="):
                raise _NeedsTree  # a merge key (or a value key): the tree path applies it
            key = self.scalar(event)
            if isinstance(key, _KEY_TYPES):
                if key in seen:
                    raise _duplicate(key, seen[key], event.start_mark)
                seen[key] = event.start_mark.line + 1
            elif not _hashable(key):
                raise _NeedsTree
            out[key] = self.node(get())


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True
