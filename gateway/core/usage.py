"""Token usage from upstream bodies and SSE streams (chat, Responses, Messages), with a fallback estimate.

The stream tracker works on whole SSE events: it forwards each event as soon as its terminating blank
line arrives, looks inside only the few events that carry usage, and can drop the chat usage chunk that the
gateway asked for on the client's behalf.
"""

from __future__ import annotations

import re
from typing import Literal, NamedTuple

from gateway.core import jsoncodec

Api = Literal["chat", "responses", "messages"]

# Text fields of all three wire formats, used only for the estimate when an upstream reports no usage.
_TEXT_RE = re.compile(rb'"(?:content|delta|text|partial_json|arguments)"\s*:\s*"((?:[^"\\]|\\.)*)"')
_CHARS_PER_TOKEN = 4
# An upstream that never ends an event ("\n\n") must not grow the buffer without bound: past this many
# bytes the buffer is forwarded as it is (its usage, if any, is then not read).
MAX_EVENT_BYTES = 1024 * 1024
# The text estimate is needed only when a stream reports no usage: up to this many bytes of a stream are
# kept (they are forwarded anyway) and scanned only if it is asked for; a longer stream is scanned as it goes.
TEXT_DEFER_BYTES = 64 * 1024
# Markers of the events that may carry usage (``_inspect_usage`` decides on the whole event).
_USAGE_MARKERS: dict[str, tuple[bytes, ...]] = {
    "chat": (b'"usage":{', b'"usage": {'),
    "responses": (b'"usage"',),
    "messages": (b"message_start", b"message_delta"),
}
# The most tokens one request can plausibly report (largest contexts are ~1-2 M). A larger count is not a
# count (BadUsage: the caller estimates), so a broken upstream can never poison a budget or the ledger,
# whose writer clamps to the same bound (gateway.store.ledger.clean_row).
MAX_TOKENS_PER_REQUEST = 10_000_000


def estimate_tokens(raw: bytes) -> int:
    return max(1, len(raw) // _CHARS_PER_TOKEN)


def estimate_output_tokens(raw: bytes) -> int:
    return max(1, sum(len(m) for m in _TEXT_RE.findall(raw)) // _CHARS_PER_TOKEN)


class BadUsage(ValueError):
    """An upstream usage field that is not a whole number of tokens."""


def token_count(v: object) -> int | None:
    """``v`` as a token count: absent, null or 0 is 0; a number or numeric string (some upstreams send
    those) within 0..MAX_TOKENS_PER_REQUEST is itself, whole; anything else (a bool, a list, NaN, 10**30, a
    negative number) is None: no count."""
    if not v:
        return 0
    if isinstance(v, bool):
        return None
    try:
        n = int(v)  # a str, float or int here; anything else raises below
    except (TypeError, ValueError, OverflowError):
        return None
    return n if 0 <= n <= MAX_TOKENS_PER_REQUEST else None


def _tok(u: dict, key: str) -> int:
    """A token count from a usage object (``token_count``); BadUsage when the value is no count."""
    n = token_count(u.get(key))
    if n is None:
        raise BadUsage(key)
    return n


def _anthropic_input(u: dict) -> int:
    cached = _tok(u, "cache_creation_input_tokens") + _tok(u, "cache_read_input_tokens")
    return _tok(u, "input_tokens") + cached


def _openai_cached(u: dict, details: str, input_tokens: int) -> int:
    """OpenAI's cached prompt tokens (``usage.<details>.cached_tokens``), a part of the input tokens."""
    d = u.get(details)
    return min(_tok(d, "cached_tokens"), input_tokens) if isinstance(d, dict) else 0


class Usage(NamedTuple):
    """Token counts of one answer. ``input_tokens`` is every input token: the cache reads and cache
    writes are parts of it (OpenAI counts cached tokens in its prompt/input tokens; Anthropic reports
    ``cache_read_input_tokens`` and ``cache_creation_input_tokens`` apart, and they are added in)."""

    input_tokens: int
    output_tokens: int
    cached_input_tokens: int = 0
    cache_write_tokens: int = 0


def read_usage(api: Api, u: dict) -> Usage:
    """THE reader of a wire format's usage object (a whole answer's ``usage``, the usage of a stream's
    event), for the ledger: chat's prompt/completion tokens, Responses' input/output tokens, Anthropic's
    input/output tokens with its cache reads and writes added into the input. BadUsage when a count is none.
    """
    if api == "chat":
        inp = _tok(u, "prompt_tokens")
        return Usage(inp, _tok(u, "completion_tokens"), _openai_cached(u, "prompt_tokens_details", inp))
    if api == "responses":
        inp = _tok(u, "input_tokens")
        return Usage(inp, _tok(u, "output_tokens"), _openai_cached(u, "input_tokens_details", inp))
    return Usage(
        _anthropic_input(u),
        _tok(u, "output_tokens"),
        _tok(u, "cache_read_input_tokens"),
        _tok(u, "cache_creation_input_tokens"),
    )


# the keys of a usage object that say it holds a count at all (else: no usage reported)
_COUNT_KEYS: dict[str, tuple[str, str]] = {
    "chat": ("prompt_tokens", "completion_tokens"),
    "responses": ("input_tokens", "output_tokens"),
    "messages": ("input_tokens", "output_tokens"),
}


def usage_from_body(api: Api, body: object) -> tuple[int, int] | None:
    """(input, output) tokens from a non-streamed response body, or None when it reports none or reports
    something that is not a token count (the caller then estimates)."""
    u = usage_details(api, body)
    return None if u is None else (u.input_tokens, u.output_tokens)


def usage_details(api: Api, body: object) -> Usage | None:
    """The ``Usage`` of a non-streamed response body, cached tokens included; None as ``usage_from_body``."""
    u = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(u, dict) or not any(k in u for k in _COUNT_KEYS[api]):
        return None
    try:
        return read_usage(api, u)
    except BadUsage:
        return None


def answer_usage(api: Api, body: object, request: bytes, answer: bytes) -> tuple[Usage, bool]:
    """The tokens of a whole answer for the ledger: the upstream's own count, else (estimated: True) the
    estimate from the request's and the answer's bytes."""
    usage = usage_details(api, body)
    if usage is not None:
        return usage, False
    return Usage(estimate_tokens(request), estimate_output_tokens(answer)), True


def _event_data(block: bytes) -> bytes:
    parts = []
    for line in block.split(b"\n"):
        if line.startswith(b"data:"):
            parts.append(line[5:].lstrip(b" "))
    return b"\n".join(parts)


class StreamUsage:
    """Feeds on upstream SSE bytes, returns the bytes to forward, and collects usage on the way."""

    __slots__ = (
        "api", "strip_usage_chunk", "_buf", "input_tokens", "output_tokens", "seen_usage", "bad_usage",
        "output_final", "_text", "cached_input_tokens", "cache_write_tokens", "_unscanned",
        "_unscanned_bytes",
    )  # fmt: skip

    def __init__(self, api: Api, strip_usage_chunk: bool = False) -> None:
        self.api = api
        self.strip_usage_chunk = strip_usage_chunk
        self._buf = b""
        self.input_tokens = 0
        self.output_tokens = 0
        self.cached_input_tokens = 0  # parts of input_tokens, as in Usage
        self.cache_write_tokens = 0
        self.seen_usage = False
        self.bad_usage = False  # an event's usage was not a token count: the caller estimates instead
        # Whether output_tokens is the final count. Anthropic's message_start carries a placeholder (often 1);
        # only message_delta carries the count, so a stream cut before it has its output estimated.
        self.output_final = False
        self._text = 0  # characters of text fields scanned so far (the estimate's input)
        self._unscanned: list[bytes] = []  # forwarded events whose text is not counted yet
        self._unscanned_bytes = 0

    def feed(self, chunk: bytes) -> bytes:
        if b"\r" in chunk:
            chunk = chunk.replace(b"\r\n", b"\n")
        buf = self._buf + chunk if self._buf else chunk
        end = buf.rfind(b"\n\n")
        if end < 0:
            if len(buf) > MAX_EVENT_BYTES:  # no event end in sight: pass the bytes on rather than hoard them
                for m in _TEXT_RE.finditer(buf):
                    self._text += len(m.group(1))
                self._buf = b""
                return buf
            self._buf = buf
            return b""
        complete, self._buf = buf[: end + 2], buf[end + 2 :]
        self._defer_text(complete)
        # Only the events that may carry usage are looked at (found from their markers; the common event
        # has none), and only a dropped one is cut out: the rest of the bytes go on as they came.
        out, at, dropped = [], 0, False
        for start, stop in self._usage_spans(complete):
            try:
                keep = self._inspect_usage(complete[start : stop - 2])
            except BadUsage:
                self.bad_usage = keep = True
            if not keep:
                out.append(complete[at:start])
                at, dropped = stop, True
        if not dropped:
            return complete
        out.append(complete[at:])
        return b"".join(out)

    def _usage_spans(self, data: bytes) -> list[tuple[int, int]]:
        """(start, stop) of each whole event of ``data`` (events ending in a blank line) holding one of the
        markers of an event that may carry usage, in order, each once."""
        spans: set[tuple[int, int]] = set()
        for marker in _USAGE_MARKERS[self.api]:
            i = data.find(marker)
            while i >= 0:
                before = data.rfind(b"\n\n", 0, i)
                start = before + 2 if before >= 0 else 0
                stop = data.find(b"\n\n", i) + 2  # data ends with a blank line: found
                spans.add((start, stop))
                i = data.find(marker, stop)
        return sorted(spans)

    def _defer_text(self, data: bytes) -> None:
        """Count the text of ``data`` for the estimate later, only if it is needed (most streams report
        their usage): up to TEXT_DEFER_BYTES are kept unscanned, past that everything is scanned now."""
        self._unscanned.append(data)
        self._unscanned_bytes += len(data)
        if self._unscanned_bytes > TEXT_DEFER_BYTES:
            self._scan_text()

    def _scan_text(self) -> None:
        if self._unscanned:
            self._text += sum(len(m) for d in self._unscanned for m in _TEXT_RE.findall(d))
            self._unscanned, self._unscanned_bytes = [], 0

    def finish(self) -> bytes:
        rest, self._buf = self._buf, b""
        if rest.strip():
            self._inspect(rest)
        return rest

    def _inspect(self, block: bytes) -> bool:
        """Record usage carried by one event; False when the event must not reach the client."""
        for m in _TEXT_RE.finditer(block):
            self._text += len(m.group(1))
        try:
            return self._inspect_usage(block)
        except BadUsage:
            self.bad_usage = True
            return True

    def _inspect_usage(self, block: bytes) -> bool:
        api = self.api
        if api == "chat":
            if b'"usage":{' not in block and b'"usage": {' not in block:
                return True
        elif api == "responses":
            if b'"usage"' not in block or b"response." not in block:
                return True
        elif b"message_start" not in block and b"message_delta" not in block:
            return True
        obj = self._json(block)
        return self.observe(obj) if obj is not None else True

    def observe(self, obj: dict) -> bool:
        """Record the usage one parsed event carries (a count that is not a count sets ``bad_usage``);
        False when the event must not reach the client. The stream translator, which parses every event
        anyway, calls this with the events that can carry usage instead of feeding the bytes."""
        try:
            return self._observe(obj)
        except BadUsage:
            self.bad_usage = True
            return True

    def _observe(self, obj: dict) -> bool:
        api = self.api
        if api == "chat":
            u = obj.get("usage")
            if isinstance(u, dict):
                keep = not (self.strip_usage_chunk and not obj.get("choices"))
                try:
                    self._take(read_usage(api, u))
                except BadUsage:
                    self.bad_usage = True
                    return keep
                self.seen_usage = self.output_final = True
                return keep
            return True
        if api == "responses":
            resp = obj.get("response")
            u = resp.get("usage") if isinstance(resp, dict) else None
            if isinstance(u, dict):
                self.seen_usage = self.output_final = True
                self._take(read_usage(api, u))
            return True
        # Anthropic messages: the event's own type decides (a text delta may quote "message_delta")
        kind = obj.get("type")
        if kind == "message_start":
            msg = obj.get("message")
            u = msg.get("usage") if isinstance(msg, dict) else None
            if isinstance(u, dict):
                self.seen_usage = True
                self._take(read_usage(api, u))
        elif kind == "message_delta":
            u = obj.get("usage")
            if isinstance(u, dict):
                self.seen_usage = True
                if "output_tokens" in u:
                    self.output_tokens = _tok(u, "output_tokens")  # cumulative
                    self.output_final = True
                if u.get("input_tokens"):
                    output = self.output_tokens
                    self._take(read_usage(api, u))
                    self.output_tokens = output
        return True

    def _take(self, u: Usage) -> None:
        self.input_tokens, self.output_tokens, self.cached_input_tokens, self.cache_write_tokens = u

    def count_text(self, data: bytes) -> None:
        """Count the text fields of whole events (for the estimate), as ``feed`` does; for a caller that
        reports usage with ``observe``."""
        self._text += sum(map(len, _TEXT_RE.findall(data)))

    def usage(self) -> Usage:
        """What the stream reported so far (meaningful when ``seen_usage``)."""
        return Usage(self.input_tokens, self.output_tokens, self.cached_input_tokens, self.cache_write_tokens)

    def counted(self, request: bytes, answered: bool) -> tuple[Usage, bool] | None:
        """The stream's tokens for the ledger and whether they are estimated: the upstream's own count (its
        output estimated from what was relayed when the stream was cut before the final count), else, when
        the stream was ``answered`` (a 200 went out), the estimate from the request's bytes and the text
        relayed; None: nothing to count."""
        if self.seen_usage and not self.bad_usage:
            usage = self.usage()
            if self.output_final:
                return usage, False
            relayed = self.estimated_output_tokens()
            return usage._replace(output_tokens=max(usage.output_tokens, relayed)), True
        if answered:
            return Usage(estimate_tokens(request), self.estimated_output_tokens()), True
        return None

    @staticmethod
    def _json(block: bytes) -> dict | None:
        data = _event_data(block)
        if not data or data == b"[DONE]":
            return None
        try:
            obj = jsoncodec.loads(data)
        except (ValueError, RecursionError):
            return None
        return obj if isinstance(obj, dict) else None

    def estimated_output_tokens(self) -> int:
        self._scan_text()
        return max(1, self._text // _CHARS_PER_TOKEN)
