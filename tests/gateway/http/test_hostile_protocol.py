"""Variants of #14's "What was seen" one layer down: requests the HTTP server itself cannot parse, and
upstream answers that are no answer. Seen: a header line over 8 KiB, an unknown method, a malformed chunk
or Content-Length got aiohttp's plain-text 400; a gzip body that was not gzip logged a traceback ("Unhandled
exception") after the client's 400; an upstream ``Retry-After: inf`` gave a 500; an upstream 204 or 302
was passed on to the client as the answer."""

from __future__ import annotations

import asyncio
import json
import logging
import math

import aiohttp
import anthropic
import openai
import pytest
from rawhttp import send_raw

from gateway.upstream.client import MAX_RETRY_AFTER_S, client_retry_after, parse_retry_after
from testkit.gateway.fake_upstream import Fault

MSGS = [{"role": "user", "content": "hi"}]
CHAT = json.dumps({"model": "gpt-fake", "messages": MSGS}).encode()


def _post(extra_head: bytes, body: bytes = CHAT, *, length: bool = True) -> bytes:
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + extra_head
    if length:
        head += b"Content-Length: %d\r\n" % len(body)
    return head + b"\r\n" + body


UNPARSABLE = {
    "a header line over 8 KiB": _post(b"X-Farm-Task: " + b"a" * 9000 + b"\r\n"),
    "an Authorization over 8 KiB": _post(b"Authorization: Bearer " + b"k" * 9000 + b"\r\n"),
    "a request line over 8 KiB": b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    "an unknown method": b"FOO /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n",
    "a malformed chunk size": _post(
        b"Transfer-Encoding: chunked\r\n", b"zz\r\nabc\r\n0\r\n\r\n", length=False
    ),
    "a negative Content-Length": _post(b"Content-Length: -1\r\n", length=False),
    "two Content-Lengths": _post(b"Content-Length: 5\r\n"),
    "a header line without a colon": _post(b"Bad Header\r\n"),
    "a Content-Encoding it cannot decode": _post(b"Content-Encoding: br\r\n", b"this is not brotli"),
}


async def _still_serving(gw, oai) -> None:
    r = await oai(gw).chat.completions.create(model="gpt-fake", messages=MSGS)
    assert r.choices[0].message.content


def _no_traceback(caplog) -> None:
    assert "Traceback" not in caplog.text
    assert not [r for r in caplog.records if r.exc_info and r.levelno >= logging.ERROR]


@pytest.mark.parametrize("case", list(UNPARSABLE))
async def test_a_request_the_server_cannot_parse_gets_json_both_sdks_read(gateway, oai, caplog, case):
    caplog.set_level(logging.INFO)
    status, headers, payload = await send_raw(gateway.port, UNPARSABLE[case])
    assert 400 <= status < 500, (status, payload[:300])
    assert headers["content-type"].startswith("application/json")
    body = json.loads(payload)
    err = body["error"]
    assert body["type"] == "error" and err["type"] == "invalid_request_error"  # Anthropic's shape
    assert {"message", "param", "code"} <= set(err)  # and OpenAI's
    assert err["message"].startswith("malformed HTTP request")
    assert len(err["message"]) < 500  # the client's 9 KB are not echoed back
    _no_traceback(caplog)
    server = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert len(server) <= 1 and all(r.levelno <= logging.INFO for r in server)  # one line at most, at INFO
    await _still_serving(gateway, oai)


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_a_body_not_in_its_content_encoding_is_one_log_line(gateway, oai, caplog, encoding):
    """The 400 was right, but aiohttp then drained the unread body, hit the decoding error again and
    logged it with a traceback as an "Unhandled exception"."""
    caplog.set_level(logging.INFO)
    key = gateway.keys["alpha"].encode()
    data = _post(b"Authorization: Bearer " + key + b"\r\nContent-Encoding: " + encoding.encode() + b"\r\n",
                 b"not compressed at all " * 200)  # fmt: skip
    status, headers, payload = await send_raw(gateway.port, data)
    assert status == 400 and headers["content-type"].startswith("application/json")
    assert encoding in json.loads(payload)["error"]["message"]
    await asyncio.sleep(0)  # the connection's lingering read, where the traceback was logged
    _no_traceback(caplog)
    await _still_serving(gateway, oai)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("inf", MAX_RETRY_AFTER_S),
        ("-inf", 0.0),
        ("1e400", MAX_RETRY_AFTER_S),
        ("99999999999", MAX_RETRY_AFTER_S),
        ("nan", None),
        ("soon", None),
        ("Fri, 31 Dec 9999 23:59:59 GMT", MAX_RETRY_AFTER_S),
        ("Mon, 01 Jan 1900 00:00:00 GMT", 0.0),
        ("2.5", 2.5),
    ],
)
def test_retry_after_is_a_finite_delay_within_a_day(value, expected):
    assert parse_retry_after({"Retry-After": value}) == expected
    ms = parse_retry_after({"retry-after-ms": value})
    assert ms is None or 0.0 <= ms <= MAX_RETRY_AFTER_S
    passed = client_retry_after({"Retry-After": value})
    if expected is None:
        assert passed is None
    else:
        assert passed is not None and 1 <= int(passed) <= MAX_RETRY_AFTER_S


@pytest.mark.parametrize("value", ["inf", "1e400", "nan", "-inf"])
async def test_an_upstream_retry_after_of_any_number_is_no_500(start_gateway, fake, value):
    gw = await start_gateway(retry={"max_retries": 0})
    fake.faults.append(Fault(status=429, retry_after=value))
    async with aiohttp.ClientSession() as s:
        hdrs = {"Authorization": f"Bearer {gw.keys['alpha']}", "Content-Type": "application/json"}
        async with s.post(f"{gw.v1}/chat/completions", data=CHAT, headers=hdrs) as r:
            assert r.status == 429, await r.text()
            passed = r.headers.get("Retry-After")
    if value == "nan":
        assert passed is None
    else:
        assert passed is not None and 1 <= int(passed) <= MAX_RETRY_AFTER_S


@pytest.mark.parametrize("status", [204, 302, 304])
async def test_an_upstream_answer_without_a_body_or_a_redirect_is_a_502(gateway, fake, oai, anth, status):
    fake.faults.append(Fault(status=status))
    with pytest.raises(openai.APIStatusError) as ei:
        await oai(gateway).chat.completions.create(model="gpt-fake", messages=MSGS)
    assert ei.value.status_code == 502
    assert f"HTTP {status}" in ei.value.message
    fake.faults.append(Fault(status=status))
    with pytest.raises(anthropic.APIStatusError) as ai:
        await anth(gateway).messages.create(model="claude-fake", max_tokens=5, messages=MSGS)
    assert ai.value.status_code == 502
    assert f"HTTP {status}" in ai.value.message
    rows = await gateway.rows()
    assert [(r["http_status"], r["error_class"]) for r in rows] == [(502, "upstream_bad_status")] * 2
    assert math.isfinite(rows[0]["latency_ms"])
    await _still_serving(gateway, oai)


async def test_an_upstream_that_sends_100_continue_and_stalls_meets_the_read_timeout(start_gateway, oai):
    """aiohttp re-arms no read timer after an interim 1xx head: the request waited forever."""

    async def interim_then_nothing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(65536)
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await writer.drain()
        await reader.read()  # until the gateway gives up and closes
        writer.close()

    server = await asyncio.start_server(interim_then_nothing, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        gw = await start_gateway(
            providers={"oa": {"base_url": f"http://127.0.0.1:{port}/v1", "read_timeout_s": 0.3,
                              "connect_timeout_s": 0.2}},
            retry={"max_retries": 0},
        )  # fmt: skip
        t0 = asyncio.get_running_loop().time()
        with pytest.raises(openai.APIStatusError) as ei:
            await oai(gw).chat.completions.create(model="gpt-fake", messages=MSGS)
        assert ei.value.status_code == 504
        assert "read timeout" in ei.value.message
        assert asyncio.get_running_loop().time() - t0 < 5
        rows = await gw.rows()
        assert [(r["http_status"], r["error_class"]) for r in rows] == [(504, "read_timeout")]
    finally:
        server.close()
