"""The token ledger's row: its shape (the ledger table's columns, gateway.core.record.LedgerRow), the
cleaning that makes any row one every database takes, and how rows become INSERT parameters.

``clean_row`` runs at the edge, in ``LedgerWriter.submit``: every string valid UTF-8 and cut to its column,
token counts clamped, other integers within 32 bits, non-finite floats made None. A value of the wrong kind
is left for the database or the driver to refuse; ``is_row_error`` tells such a refusal (the row's data)
from the database being unavailable.

On a dialect with positional parameters (SQLite, asyncpg) the INSERT is compiled once (``LedgerInsert``)
and fed plain tuples through the driver's executemany, with the column types' own bind processors applied
here. Measured on SQLite, that takes a row from 41 us of CPU (the Core insert) to 24 us (raw sqlite3
alone: 7 us); at 1500 requests/s the difference is 2.5% of a core in the gateway's process. Elsewhere the
Core insert is used.
"""

from __future__ import annotations

import math
import operator
import sys
from collections.abc import Callable
from datetime import datetime
from itertools import chain, compress, repeat
from typing import Any

from sqlalchemy import DateTime, Float, Integer, String
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, OperationalError, StatementError
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.core.record import LedgerRow
from gateway.core.usage import MAX_TOKENS_PER_REQUEST
from gateway.store.db import ledger
from gateway.store.ledger_binds import Convert, column_converter


def column_key(name: str) -> str:
    """A column's name as a row's key: a plain interned str. SQLAlchemy's names are ``quoted_name`` (a str
    subclass): every dict lookup with one compared the characters (about 25k instructions a row on the
    request path, in ``clean_row`` and the spool line); an interned str is the very object of the row's
    literal keys (gateway.core.record.Record.row), found by identity."""
    return sys.intern(str.__str__(name))


# the row's shape: the ledger table's columns, in its order (the spool header's too)
COLUMNS = tuple(column_key(c.name) for c in ledger.columns)
_COLUMNS = frozenset(COLUMNS)
# every column, as a row that leaves it out gets it (the column's scalar default, else None)
DEFAULTS = {
    column_key(c.name): c.default.arg if c.default is not None and c.default.is_scalar else None
    for c in ledger.columns
}
row_values = operator.itemgetter(*COLUMNS)  # a clean row's values in the spool header's order
DATETIMES = tuple(column_key(c.name) for c in ledger.columns if isinstance(c.type, DateTime))

# cleaning at the edge
_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1  # PostgreSQL INTEGER; SQLite takes more, but not every database
_TOKENS = ("input_tokens", "output_tokens")
_STRINGS = tuple(
    (column_key(c.name), c.type.length or 1 << 20) for c in ledger.columns if isinstance(c.type, String)
)
_INTS = tuple(
    column_key(c.name) for c in ledger.columns if isinstance(c.type, Integer) and c.name not in _TOKENS
)
_FLOATS = tuple((column_key(c.name), c.nullable) for c in ledger.columns if isinstance(c.type, Float))
# surrogates: U+DC80..U+DCFF are bytes that were not UTF-8 (surrogateescape); the rest are lone ones
_LONE, _ESCAPED, _ESCAPED_END, _LONE_END = "\ud800", "\udc80", "\udcff", "\udfff"


def clean_text(v: str, n: int) -> str:
    """``v`` as valid UTF-8 text of at most ``n`` characters: surrogates (bytes that were not UTF-8, kept
    by aiohttp's surrogateescape, or lone ones from JSON) and NUL become U+FFFD."""
    if len(v) > n:
        v = v[:n]
    if not v.isascii():
        try:
            v.encode()
        except UnicodeEncodeError:
            try:
                v = v.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
            except UnicodeEncodeError:  # a surrogate that is no escaped byte (JSON "\ud800")
                v = "".join(
                    "\ufffd" if _LONE <= c < _ESCAPED or _ESCAPED_END < c <= _LONE_END else c for c in v
                )
                v = v.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
            if len(v) > n:
                v = v[:n]
    if "\x00" in v:  # PostgreSQL text cannot hold NUL
        v = v.replace("\x00", "\ufffd")
    return v


def _tokens(v: Any) -> tuple[int, bool]:
    """A token count within 0..MAX_TOKENS_PER_REQUEST, and whether it had to be made up."""
    if isinstance(v, float) and math.isfinite(v) or isinstance(v, bool):
        v = int(v)
    if type(v) is not int:
        return 0, v is not None
    if v < 0:
        return 0, True
    if v > MAX_TOKENS_PER_REQUEST:
        return MAX_TOKENS_PER_REQUEST, True
    return v, False


_string_values = operator.itemgetter(*(name for name, _ in _STRINGS))
_STRING_LENGTHS = tuple(n for _, n in _STRINGS)


def _strings_plain(values: tuple) -> bool:
    """Whether a row's string columns need no cleaning, checked all at once (the common row: ASCII
    without NUL, each within its column's length): a few C calls where the loop over the columns made
    sixteen rounds of Python. False (the loop decides) for anything else, a value no str included."""
    texts = [v or "" for v in values]
    try:
        joined = "".join(texts)
    except TypeError:  # a value of another kind: the loop leaves it for the writer to refuse
        return False
    return (
        joined.isascii() and "\x00" not in joined and all(map(operator.le, map(len, texts), _STRING_LENGTHS))
    )


def clean_row(row: LedgerRow | dict, *, owned: bool = False) -> dict:
    """A copy of ``row`` that every database takes: every ledger column and only those (a missing one
    gets its default); strings valid UTF-8 without NUL, cut to their column's length; token counts within
    0..MAX_TOKENS_PER_REQUEST (``tokens_estimated`` set when one was not plausible); other integers within
    32 bits; non-finite floats None (or 0 where the column needs a value). A value of the wrong kind (a
    dict for a string) is left for the writer to refuse, with its row alone. ``owned``: the caller gives
    the row away (the request path's, built with every column), so it is cleaned in place, not copied."""
    if owned and row.keys() == _COLUMNS:
        out = row
    else:
        out = {**DEFAULTS, **row}
        if len(out) != len(DEFAULTS):
            for k in [k for k in out if k not in _COLUMNS]:
                del out[k]
    if not _strings_plain(_string_values(out)):
        for name, n in _STRINGS:
            v = out[name]
            if v.__class__ is str and (len(v) > n or not v.isascii() or "\x00" in v):
                out[name] = clean_text(v, n)
    for name in _TOKENS:
        v = out[name]
        if v.__class__ is not int or v < 0 or v > MAX_TOKENS_PER_REQUEST:
            out[name], made_up = _tokens(v)
            if made_up:
                out["tokens_estimated"] = True
    for name in _INTS:
        v = out[name]
        if v.__class__ is int:
            if v < _INT_MIN or v > _INT_MAX:
                out[name] = _INT_MIN if v < 0 else _INT_MAX
        elif v.__class__ is float:
            out[name] = min(max(int(v), _INT_MIN), _INT_MAX) if math.isfinite(v) else None
    for name, nullable in _FLOATS:
        v = out[name]
        if v.__class__ is float and v - v != 0.0:  # inf or nan
            out[name] = None if nullable else 0.0
    return out


_PLAIN_TYPES = (str, int, float, type(None))  # what every driver binds as it is (bool is an int)
_PLAIN = frozenset({*_PLAIN_TYPES, bool})
_NULLS = repeat(None)  # map(operator.is_, values, _NULLS): which values are None


class LedgerInsert:
    """The ledger INSERT compiled once for a positional-parameter dialect; rows become tuples in its
    parameter order, each value through its column type's bind processor (as SQLAlchemy would store it)."""

    def __init__(self, engine: AsyncEngine) -> None:
        dialect = engine.dialect
        names = [c.name for c in ledger.columns]
        compiled = ledger.insert().compile(dialect=dialect, column_keys=names)
        self.sql = compiled.string
        order = [column_key(name) for name in compiled.positiontup or ()]
        assert sorted(order) == sorted(names), (order, names)
        self.defaults: list[tuple[str, Any]] = []  # (column, value when the row has none), in order
        self.processors: list[tuple[int, Callable[[Any], Any]]] = []  # (position, bind processor)
        self.converters: list[tuple[int, Convert]] = []  # (position, the processor a column at a time)
        native: set[type] = set()  # value types the driver binds itself (asyncpg: datetime)
        for i, name in enumerate(order):
            col = ledger.c[name]
            default = col.default.arg if col.default is not None and col.default.is_scalar else None
            self.defaults.append((name, default))
            process = col.type.dialect_impl(dialect).bind_processor(dialect)
            if process is not None:
                self.processors.append((i, process))
                self.converters.append((i, column_converter(col.type, process, dialect.name)))
            elif isinstance(col.type, DateTime):  # no processor: the driver takes the datetime as it is
                native.add(datetime)
        self._in_order = operator.itemgetter(*order)
        self._plain = _PLAIN | native
        self._plain_types = (*_PLAIN_TYPES, *native)
        # sqlite3 binds a None through its adapter lookup (two failed attribute lookups, each formatting an
        # AttributeError): a row's ten NULLs cost more than its twenty values. On SQLite a row's NULL columns
        # are therefore left out of its INSERT (no ledger column has a server default: NULL either way), one
        # statement per pattern of NULLs; rows of one kind (successful chat calls, ...) share one.
        self.omit_nulls = (
            dialect.name == "sqlite"
            and dialect.paramstyle == "qmark"
            and all(ledger.c[name].server_default is None for name in order)
        )
        self._table = dialect.identifier_preparer.format_table(ledger)
        self._quoted = [dialect.identifier_preparer.quote(name) for name in order]
        self._by_pattern: dict[tuple[bool, ...], tuple[str, tuple[bool, ...]]] = {}

    @staticmethod
    def supported(engine: AsyncEngine) -> bool:
        return bool(engine.dialect.positional)

    def statements(self, params: list[tuple]) -> list[tuple[str, list[tuple]]]:
        """``params`` as (SQL, rows) pairs to execute: one INSERT of every column, or on SQLite one INSERT
        per pattern of NULLs, naming only the columns that have a value."""
        if not self.omit_nulls:
            return [(self.sql, params)]
        groups: dict[tuple[bool, ...], list[tuple]] = {}
        for values in params:
            nulls = tuple(map(operator.is_, values, _NULLS))
            group = groups.get(nulls)
            if group is None:
                group = groups[nulls] = []
            group.append(values)
        out = []
        for nulls, rows in groups.items():
            if not any(nulls):
                out.append((self.sql, rows))
                continue
            sql, keep = self._statement(nulls)
            out.append((sql, [tuple(compress(values, keep)) for values in rows]))
        return out

    def _statement(self, nulls: tuple[bool, ...]) -> tuple[str, tuple[bool, ...]]:
        found = self._by_pattern.get(nulls)
        if found is None:
            keep = tuple(not n for n in nulls)
            names = ", ".join(compress(self._quoted, keep))
            marks = ", ".join("?" * sum(keep))
            found = self._by_pattern[nulls] = (f"INSERT INTO {self._table} ({names}) VALUES ({marks})", keep)
        return found

    def params_many(self, rows: list[dict]) -> list[tuple]:
        """``params`` of each row, converted a column at a time (gateway.store.ledger_binds); a batch with
        a row that lacks a column, or a value no driver could bind, goes row by row (whose ValueError names
        the column)."""
        if not rows:
            return []
        try:
            cols: list[Any] = list(zip(*map(self._in_order, rows), strict=True))
        except KeyError:
            return [self.params(row) for row in rows]
        for i, convert in self.converters:
            cols[i] = convert(cols[i])
        if not self._plain.issuperset(map(type, chain.from_iterable(cols))):
            return [self.params(row) for row in rows]
        return list(zip(*cols, strict=True))

    def params(self, row: dict) -> tuple:
        """The row's parameters in order; ValueError names a value no driver could bind."""
        try:
            values = list(self._in_order(row))  # a clean row has every column
        except KeyError:
            get = row.get
            values = [get(name, default) for name, default in self.defaults]
        for i, process in self.processors:
            if values[i] is not None:
                values[i] = process(values[i])
        if not self._plain.issuperset(map(type, values)):
            for (name, _), value in zip(self.defaults, values, strict=True):
                if not isinstance(value, self._plain_types):
                    raise ValueError(f"column {name}: cannot store a {type(value).__name__}")
        return tuple(values)


class BadRow(Exception):
    """A row with a value its column cannot take, found before it reached the database."""


_CLIENT_SIDE = (ValueError, TypeError, OverflowError)  # UnicodeEncodeError is a ValueError


def _causes(e: BaseException | None):
    for _ in range(6):
        if e is None:
            return
        yield e
        e = e.__cause__ or getattr(e, "orig", None)


def is_row_error(e: Exception) -> bool:
    """Whether the rows' data was refused (by the database, or by the driver binding a value), not the
    database being unavailable. Driver-side refusals come as the driver raised them (sqlite3:
    UnicodeEncodeError for a surrogate, OverflowError for an integer over 64 bits) or, from asyncpg,
    as an InterfaceError caused by its DataError (a ValueError)."""
    if isinstance(e, (DataError, IntegrityError, BadRow)):
        return True
    if isinstance(e, OperationalError):
        return False
    if isinstance(e, DBAPIError):
        return any(isinstance(c, _CLIENT_SIDE) for c in _causes(e.orig))
    if isinstance(e, StatementError):  # SQLAlchemy could not bind a value
        return True
    return isinstance(e, _CLIENT_SIDE)
