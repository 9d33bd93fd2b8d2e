"""Streamed answers: upstream SSE bytes in one format -> client SSE bytes in another, as they arrive.

Bytes are cut into whole SSE events (a chunk may end anywhere, inside a UTF-8 character or a ``data:``
line); each event's JSON is read once by the source format's ``Decoder`` into hub events, plain tuples::

    ("start", source_id, created, usage | None)    the answer began (usage: Anthropic's input count)
    ("text", key, text)                            text delta of block ``key``
    ("tool", key, call_id, name)                   a tool call block begins
    ("args", key, fragment)                        a fragment of its JSON arguments
    ("end", key)                                   block ``key`` is complete
    ("finish", stop, stop_sequence, usage)         the answer is complete
    ("error", status, message)                     the upstream reported an error mid-stream

and the client format's ``Encoder`` writes each as soon as it arrives. Nothing is held back except the tail of
an unfinished event.

The translator also counts the tokens for the gateway's ledger: ``tokens`` is a ``StreamUsage`` that the
decoder hands the events carrying usage (already parsed), so the upstream's bytes are read once.

A stream in the client's own format (``src == dst``) has a translator too, ``PassThrough``: the upstream's
bytes as they are, counted on the way. ``stream_translator(src, dst, ...)`` gives the one a pair needs; both
have the same face (``feed``, ``finish``, ``error_event``, ``failed``, ``tokens``).
"""

from __future__ import annotations

from gateway.core.usage import StreamUsage
from gateway.errors import ApiStyle, sse_error_event
from gateway.translate import chat, messages, responses
from gateway.translate.ir import Format, Usage, loads

_DECODERS = {"chat": chat.Decoder, "responses": responses.Decoder, "messages": messages.Decoder}


def _encoder(dst: Format, model: str, created: int | None, include_usage: bool, tool_names):
    if dst == "chat":
        return chat.Encoder(model, created, include_usage)
    if dst == "responses":
        return responses.Encoder(model, created, tool_names)
    return messages.Encoder(model)


# Events a decoder would parse only to skip: Anthropic's keep-alive.
_SKIPPED_EVENTS = frozenset({b"ping"})


def _event_data(block: bytes) -> bytes | None:
    """The data of one SSE event (data lines joined with newlines, comments skipped), or None for an
    event to skip unread. The usual shapes (one ``data: X`` line, or an ``event: NAME`` line then one
    ``data: X`` line) are cut without splitting lines."""
    if block[:6] == b"data: ":
        if b"\n" not in block:
            return block[6:]
    elif block[:7] == b"event: ":
        nl = block.find(b"\n")
        if nl > 0:
            if block[7:nl].strip() in _SKIPPED_EVENTS:
                return None
            if block[nl + 1 : nl + 7] == b"data: " and block.find(b"\n", nl + 1) < 0:
                return block[nl + 7 :]
    data: list[bytes] = []
    for line in block.split(b"\n"):
        if line.startswith(b"data:"):
            data.append(line[6:] if line[5:6] == b" " else line[5:])
        elif line.startswith(b"event:") and line[6:].strip() in _SKIPPED_EVENTS:
            return None
    return b"\n".join(data)


class StreamTranslator:
    """Feed it the upstream's SSE bytes (``src`` format), get the client's (``dst`` format) back.

    ``feed`` returns whatever can be written now (often b"" while an event is incomplete); ``finish``
    is called once when the upstream's bytes end and returns the rest. A stream cut short ends with the
    client format's error event. ``input_tokens`` (cached ones included), ``output_tokens`` and
    ``cached_input_tokens`` give the usage the upstream reported so far, as the client sees it;
    ``tokens`` counts them for the ledger exactly as a ``StreamUsage`` fed the same bytes would. For
    ``src == dst``, ``PassThrough`` (``stream_translator`` picks).
    """

    __slots__ = (
        "src", "dst", "tokens", "_decoder", "_encoder", "_buf", "_started", "_closed", "failed",
        "_calls",
    )  # fmt: skip

    def __init__(
        self,
        src: Format,
        dst: Format,
        *,
        public_model: str,
        include_usage: bool = True,
        created: int | None = None,
        tool_names: responses.ToolNames | None = None,
    ) -> None:
        """``include_usage``: chat clients only get the final usage chunk when they asked for it;
        ``created``: the timestamp to stamp (default: the upstream's, else now); ``tool_names``: a Responses
        client's namespaced tools (gateway.translate.namespaces)."""
        self.src, self.dst = src, dst
        self.tokens = StreamUsage(src)
        self._decoder = _DECODERS[src](self.tokens.observe)
        self._encoder = _encoder(dst, public_model, created, include_usage, tool_names)
        self._buf = b""
        self._started = False
        self._closed = False
        self.failed: str | None = None  # the message of the error event that ended the stream, if one did
        # Anthropic clients read a tool call's input as JSON pieces that must add up to an object (their SDK
        # parses the pieces as they come): each call's name and pieces are held and checked at its end, then
        # sent as one piece (OpenAI formats carry arguments as text, passed on as they come)
        self._calls: dict[int, tuple[str, list[str]]] | None = {} if dst == "messages" else None

    # -- usage, for the caller's accounting
    @property
    def usage(self) -> Usage:
        return self._decoder.usage

    @property
    def input_tokens(self) -> int:
        return self._decoder.usage.input

    @property
    def output_tokens(self) -> int:
        return self._decoder.usage.output

    @property
    def cached_input_tokens(self) -> int:
        return self._decoder.usage.cached

    @property
    def seen_usage(self) -> bool:
        return self._decoder.seen_usage

    # -- bytes
    def feed(self, chunk: bytes) -> bytes:
        buf = self._buf + chunk if self._buf else chunk
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        end = buf.rfind(b"\n\n")
        if end < 0:
            self._buf = buf
            return b""
        complete, self._buf = buf[:end], buf[end + 2 :]
        self.tokens.count_text(complete)
        return self._translate(complete.split(b"\n\n"))

    def finish(self) -> bytes:
        """The upstream's bytes ended: translate a last unterminated event, and end the client's stream
        (with an error event when the upstream never finished its answer)."""
        rest, self._buf = self._buf, b""
        if rest.strip():
            self.tokens.count_text(rest)
            out = self._translate([rest], cut=True)
        else:
            out = b""
        if self._closed:
            return out
        hub: list = []
        self._decoder.end(hub)
        return out + self._emit(hub)

    def error_event(self, status: int, message: str) -> bytes:
        """The client-format events that end a stream with an error (the status line has gone out)."""
        self._closed = True
        return self._encoder.error(status, message)

    # -- internals
    def _translate(self, blocks: list[bytes], cut: bool = False) -> bytes:
        hub: list = []
        decoder = self._decoder
        for block in blocks:
            raw_data = _event_data(block)
            if not raw_data:
                continue
            data = raw_data.decode("utf-8", "replace")
            try:
                decoder.feed(data, hub)
            except (ValueError, TypeError, AttributeError, KeyError):
                if cut:  # the last event, unterminated and unreadable: the stream was cut inside it
                    hub.append(("error", 502, "the upstream stream ended before the answer was complete"))
                else:
                    hub.append(("error", 502, f"the upstream sent a malformed stream event: {data[:200]!r}"))
                decoder.finished = True
                break
        return self._emit(hub)

    def _emit(self, hub: list) -> bytes:
        if self._closed or not hub:
            return b""
        enc = self._encoder
        out: list[bytes] = []
        for ev in hub:
            tag = ev[0]
            if tag == "error":
                out.append(enc.error(ev[1], ev[2]))
                self._closed = True
                self.failed = str(ev[2])
                break
            if not self._started:
                self._started = True
                if tag == "start":
                    out.append(enc.start(ev[1], ev[2], ev[3]))
                    continue
                out.append(enc.start(None, None, None))
            if tag == "text":
                out.append(enc.text(ev[1], ev[2]))
            elif tag == "args":
                if self._calls is not None and ev[1] in self._calls:
                    self._calls[ev[1]][1].append(ev[2])
                else:
                    out.append(enc.args(ev[1], ev[2]))
            elif tag == "tool":
                out.append(enc.tool(ev[1], ev[2], ev[3]))
                if self._calls is not None:
                    self._calls[ev[1]] = (ev[3], [])
            elif tag == "end":
                if not self._release_call(ev[1], out):
                    break
                out.append(enc.end(ev[1]))
            elif tag == "finish":
                if not all(self._release_call(key, out) for key in list(self._calls or ())):
                    break
                out.append(enc.finish(ev[1], ev[2], ev[3]))
                self._closed = True
                break
        return b"".join(out)

    def _release_call(self, key: int, out: list[bytes]) -> bool:
        """The held tool call of block ``key`` (if any) to ``out``: its arguments as one piece when they are
        a JSON object (or empty), else the error event that ends the stream. False when it ended."""
        call = self._calls.pop(key, None) if self._calls is not None else None
        if call is None:
            return True
        name, pieces = call
        text = "".join(pieces)
        if not text.strip():
            return True  # no arguments: an empty input
        try:
            obj = loads(text)
        except ValueError:
            obj = None
        if isinstance(obj, dict):
            out.append(self._encoder.args(key, text))
            return True
        message = (
            f"the upstream's tool call {name!r} has arguments that are not a JSON object: {text[:200]!r}"
        )
        out.append(self._fail(message))
        return False

    def _fail(self, message: str) -> bytes:
        self._closed = True
        self.failed = message
        return self._encoder.error(502, message)


class PassThrough:
    """The translator of a stream in the client's own format: the upstream's bytes as they are, counted on
    the way (``tokens``), a chat stream's usage chunk taken out when the client did not ask for it
    (``include_usage``: the gateway asked on its behalf). An upstream error event passes as it is."""

    __slots__ = ("tokens", "feed", "finish", "_style", "_responses")
    failed = None  # an error event is the upstream's own, relayed: the stream is not failed by translation

    def __init__(self, fmt: Format, *, include_usage: bool = True) -> None:
        self.tokens = StreamUsage(fmt, strip_usage_chunk=not include_usage)
        self.feed, self.finish = self.tokens.feed, self.tokens.finish
        self._style: ApiStyle = "anthropic" if fmt == "messages" else "openai"
        self._responses = fmt == "responses"

    def error_event(self, status: int, message: str) -> bytes:
        """The client-format events that end a stream with an error (the status line has gone out)."""
        return sse_error_event(self._style, status, message, responses_api=self._responses)


def stream_translator(
    src: Format,
    dst: Format,
    *,
    public_model: str,
    include_usage: bool = True,
    tool_names: responses.ToolNames | None = None,
) -> StreamTranslator | PassThrough:
    """The translator of an upstream stream in ``src`` for a client of ``dst``: ``PassThrough`` for the
    client's own format, else a ``StreamTranslator``."""
    if src == dst:
        return PassThrough(dst, include_usage=include_usage)
    return StreamTranslator(
        src, dst, public_model=public_model, include_usage=include_usage, tool_names=tool_names
    )
