"""Property-based fuzzing of the five endpoints' bodies and headers (hypothesis): whatever a client sends,
the gateway answers in JSON without an error of its own (no 5xx that did not come from the upstream) and keeps
serving.

The gateway and the fake upstream run in a thread with their own event loop, and requests go byte for byte
over a socket, so header values no HTTP library would send (non-ASCII, latin-1) are tried too.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.http.app import GATEWAY, create_app
from gateway.http.server import GatewayRunner
from testkit.gateway.fake_upstream import FakeUpstream

PATHS = [
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/farm/summaries",
]
HEADER_NAMES = [
    "X-Farm-Task",
    "X-Claude-Code-Session-Id",
    "session-id",
    "anthropic-version",
    "anthropic-beta",
    "openai-beta",
    "accept",
    "Content-Encoding",
]


class LiveGateway:
    """A fake upstream and a gateway served from a background thread."""

    def __init__(self, tmp_path, make_settings) -> None:
        self.make_settings = make_settings
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.tmp_path = tmp_path
        self.fake: FakeUpstream | None = None
        self.runner: web.AppRunner | None = None
        self.port = 0
        self.key = ""
        self.call(self._start())

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    async def _start(self) -> None:
        self.fake = FakeUpstream(record=False)
        await self.fake.start()
        app = create_app(self.make_settings(self.fake, self.tmp_path / "fuzz.db", retry={"max_retries": 0}))
        self.runner = GatewayRunner(app, handler_cancellation=True, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = self.runner.addresses[0][1]
        self.app = app
        key, _ = await app[GATEWAY].keys.create("alpha", "fuzz")
        self.key = key

    async def _stop(self) -> None:
        await self.runner.cleanup()
        await self.fake.close()

    def close(self) -> None:
        self.call(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def request(
        self, method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> tuple[int, bytes]:
        head = [f"{method} {path} HTTP/1.1".encode(), b"Host: 127.0.0.1", b"Connection: close"]
        head += [k + b": " + v for k, v in headers]
        head.append(b"Content-Length: %d" % len(body))
        with socket.create_connection(("127.0.0.1", self.port), timeout=30) as s:
            s.sendall(b"\r\n".join(head) + b"\r\n\r\n" + body)
            chunks = []
            while data := s.recv(65536):
                chunks.append(data)
        raw = b"".join(chunks)
        status_line, _, rest = raw.partition(b"\r\n")
        _, _, payload = rest.partition(b"\r\n\r\n")
        return int(status_line.split()[1]), payload


@pytest.fixture(scope="module")
def live(tmp_path_factory, settings_factory):
    g = LiveGateway(tmp_path_factory.mktemp("fuzz"), settings_factory)
    yield g
    g.close()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
# Bodies that look like requests (a known model, fields of the right names with any values) and any JSON.
request_like = st.fixed_dictionaries(
    {"model": st.sampled_from(["gpt-fake", "claude-fake", "gpt-beta", "nope", ""]) | json_values},
    optional={
        "messages": json_values,
        "input": json_values,
        "stream": json_values,
        "max_tokens": json_values,
        "max_output_tokens": json_values,
        "stream_options": json_values,
        "task": st.sampled_from(["checklist", "log_summary"]) | json_values,
        "anomalies": json_values,
        "system": json_values,
    },
)
bodies = (
    request_like.map(lambda d: json.dumps(d).encode())
    | json_values.map(lambda v: json.dumps(v).encode())
    | st.binary(max_size=200)
)
# Control characters are not HTTP: aiohttp's parser refuses them with its own plain-text 400 before any
# route runs (test_control_characters_in_a_header_are_a_400); every other byte, UTF-8 or not, is fuzzed.
header_values = st.binary(min_size=1, max_size=30).filter(
    lambda b: all(c >= 0x20 and c != 0x7F for c in b) and b.strip() == b
)
headers = st.lists(st.tuples(st.sampled_from(HEADER_NAMES).map(str.encode), header_values), max_size=3)


def _check(status: int, payload: bytes) -> None:
    body = json.loads(payload)  # always JSON
    assert isinstance(body, dict)
    message = json.dumps(body)
    assert "internal gateway error" not in message
    if status >= 500:  # only an upstream failure may be a 5xx, and then it says so
        assert "upstream" in message, (status, body)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(PATHS), body=bodies, extra=headers)
def test_any_body_and_headers_get_an_answer_of_the_gateway_never_a_5xx_of_its_own(live, path, body, extra):
    hdrs = [
        (b"Authorization", b"Bearer " + live.key.encode()),
        (b"Content-Type", b"application/json"),
        *extra,
    ]
    status, payload = live.request("POST", path, hdrs, body)
    _check(status, payload)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    method=st.sampled_from(["GET", "PUT", "DELETE", "PATCH", "POST"]),
    path=st.text(
        alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters="?#%"), max_size=30
    ),
)
def test_any_route_gets_a_json_answer(live, method, path):
    status, payload = live.request(method, "/" + path, [], b"")
    assert status < 500
    if status != 200:
        _check(status, payload)


@pytest.mark.parametrize("value", [b"\x00", b"a\x01b", b"\x7f"])
def test_control_characters_in_a_header_are_a_400(live, value):
    status, _ = live.request("POST", "/v1/chat/completions", [(b"X-Farm-Task", value)], b"{}")
    assert status == 400


def test_still_serving_after_the_fuzzing(live):
    body = json.dumps({"model": "gpt-fake", "messages": [{"role": "user", "content": "hi"}]}).encode()
    hdrs = [(b"Authorization", b"Bearer " + live.key.encode()), (b"Content-Type", b"application/json")]
    status, payload = live.request("POST", "/v1/chat/completions", hdrs, body)
    assert status == 200, payload
