"""Probing the gateway over HTTP: one request as the tool would send it (``Prober.request``), its
``Reply``, and ``ProbeFailed`` with the check that explains a request that got no HTTP answer (DNS,
connection refused or timed out, no answer within the read timeout)."""

from __future__ import annotations

import errno
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp

from gateway.ops.doctor.checks import Check, _fail
from gateway.ops.doctor.inputs import DoctorInput


@dataclass
class Reply:
    status: int
    headers: Mapping[str, str]
    text: str
    elapsed_ms: float

    def json(self) -> dict:
        try:
            data = json.loads(self.text)
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}

    def is_html(self) -> bool:
        ctype = self.headers.get("Content-Type", "")
        head = self.text.lstrip()[:15].lower()
        return "text/html" in ctype or head.startswith(("<!doctype", "<html"))

    def error(self) -> tuple[str, str]:
        """(code or type, message) from an OpenAI- or Anthropic-shaped error body."""
        err = self.json().get("error")
        if not isinstance(err, dict):
            return "", self.text[:200]
        return str(err.get("code") or err.get("type") or ""), str(err.get("message", ""))


class ProbeFailed(Exception):
    """The probe got no HTTP answer; ``check`` explains."""

    def __init__(self, check: Check) -> None:
        super().__init__(check.message)
        self.check = check


class Prober:
    def __init__(self, session: aiohttp.ClientSession, inp: DoctorInput) -> None:
        self.session = session
        self.inp = inp

    async def request(
        self, name: str, method: str, url: str, headers: dict, body: dict | None = None
    ) -> Reply:
        t0 = time.monotonic()
        try:
            async with self.session.request(method, url, headers=headers, json=body) as resp:
                text = await resp.text(errors="replace")
                return Reply(resp.status, resp.headers, text, (time.monotonic() - t0) * 1000)
        except aiohttp.ClientConnectorDNSError as e:
            raise ProbeFailed(
                _fail(
                    name,
                    f"the host in {url} does not resolve ({e.os_error}).",
                    "check the spelling of the host name, or your VPN/DNS.",
                )
            ) from None
        except (aiohttp.ConnectionTimeoutError, aiohttp.ServerTimeoutError) as e:
            if isinstance(e, aiohttp.ConnectionTimeoutError) or "connect" in str(e).lower():
                raise ProbeFailed(
                    _fail(
                        name,
                        f"no TCP connection to {_hostport(url)} within {self.inp.connect_timeout_s:g} s: the "
                        "host is down, a firewall drops the packets, or you need the VPN.",
                        "check the host and port; from another machine the gateway must listen on a "
                        "reachable address (host: 0.0.0.0 in its config).",
                    )
                ) from None
            raise ProbeFailed(_read_timeout(name, url, self.inp.read_timeout_s)) from None
        except TimeoutError:
            raise ProbeFailed(_read_timeout(name, url, self.inp.read_timeout_s)) from None
        except aiohttp.ClientConnectorError as e:
            refused = e.os_error.errno == errno.ECONNREFUSED or isinstance(e.os_error, ConnectionRefusedError)
            why = "nothing is listening there" if refused else "the network has no route to it (VPN?)"
            raise ProbeFailed(
                _fail(
                    name,
                    f"cannot connect to {_hostport(url)} ({e.os_error.strerror or e.os_error}): {why}.",
                    "start the gateway (`farm gateway serve`) or correct the host/port in the base URL.",
                )
            ) from None
        except aiohttp.ClientError as e:
            raise ProbeFailed(
                _fail(name, f"the request to {url} failed: {e!r}.", "check the base URL.")
            ) from None


def _hostport(url: str) -> str:
    return url.split("://", 1)[-1].split("/", 1)[0]


TIMEOUT_FIX = (
    "for real work: lower max_tokens, split the task into smaller requests, or stream (a stream sends "
    "tokens as they come, so there is no long silence); raise the client's timeout if the answer is big."
)


def _read_timeout(name: str, url: str, seconds: float) -> Check:
    return _fail(
        name, f"connected, but {url} sent no answer within {seconds:g} s (read timeout).", TIMEOUT_FIX
    )
