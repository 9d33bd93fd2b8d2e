"""The doctor's run: read the tool's settings, check the key locally, then probe the gateway exactly as
the tool would: GET the model list (the base URL and the key), then one call with the smallest output
(the model, and the translation path), and for Claude Code and Codex the client's recorded request shape
as a dry run (what the model's translation would drop or refuse). Each step adds its checks; a step with
no HTTP answer ends the run with the check that explains it."""

from __future__ import annotations

import aiohttp

from gateway.ops.doctor.checks import Check, _fail, _pass, _warn
from gateway.ops.doctor.inputs import DoctorInput, Resolved
from gateway.ops.doctor.key import check_key
from gateway.ops.doctor.probe import TIMEOUT_FIX, ProbeFailed, Prober, Reply
from gateway.ops.doctor.refusals import rate_limited, unauthorized
from gateway.ops.doctor.settings import read_settings
from gateway.ops.doctor.shape import check_shape
from gateway.ops.onboarding import root_url
from gateway.translate.api import ANTHROPIC_VERSION


class Doctor:
    def __init__(self, inp: DoctorInput) -> None:
        self.inp = inp
        self.checks: list[Check] = []
        self.anthropic_style = inp.tool == "claude-code"
        self.auth_header: str | None = None
        self.resolved: Resolved | None = None

    def add(self, check: Check) -> Check:
        self.checks.append(check)
        return check

    def resolve(self) -> Resolved:
        return read_settings(self.inp, self.checks)

    def headers(self, key: str) -> dict[str, str]:
        """The headers the tool sends: the key in its header, and any other credential header besides."""
        r = self.resolved
        h: dict[str, str] = {}
        if r is not None and r.also is not None:
            other, _, value = r.also
            h["x-api-key" if other == "x-api-key" else "Authorization"] = (
                value if other == "x-api-key" else self.auth_header or f"Bearer {value}"
            )
        if r is not None and r.key_header == "x-api-key":
            h["x-api-key"] = key
        else:
            h["Authorization"] = self.auth_header or f"Bearer {key}"
        if self.anthropic_style:
            h["anthropic-version"] = ANTHROPIC_VERSION
        return h

    def models_url(self, base: str) -> str:
        """Where the tool's SDK sends GET models: the Anthropic SDK adds /v1, the openai SDK does not."""
        return base.rstrip("/") + ("/v1/models" if self.anthropic_style else "/models")

    async def run(self) -> list[Check]:
        r = self.resolve()
        self.resolved = r
        self.auth_header = r.auth_header
        key_check, key = check_key(r)
        self.add(key_check)
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self.inp.connect_timeout_s, sock_read=self.inp.read_timeout_s
        )
        async with aiohttp.ClientSession(timeout=timeout) as session:
            probe = Prober(session, self.inp)
            try:
                allowed = await self.base_and_auth(probe, r, key)
                if allowed is not None and key is not None:
                    await self.model_call(probe, r, key, allowed)
            except ProbeFailed as e:
                self.add(e.check)
        return self.checks

    async def base_and_auth(self, probe: Prober, r: Resolved, key: str | None) -> list[str] | None:
        """GET the model list as the tool would; returns the allowed models when the key works."""
        url = self.models_url(r.base_url)
        reply = await probe.request("base URL", "GET", url, self.headers(key or "none"))
        if reply.is_html():
            self.add(
                _fail(
                    "base URL",
                    f"{url} answered {reply.status} with a web page (HTML), not the API: this looks like "
                    "a dashboard or docs address.",
                    f"use the gateway's API address, e.g. {self._suggest(self.inp.default_base_url)}.",
                )
            )
            return None
        if reply.status == 404:
            await self.wrong_base(probe, r, key)
            return None
        if reply.status == 401:
            self.add(_pass("base URL", f"{r.base_url} is the gateway (from {r.base_from})."))
            self.add(await unauthorized(self.inp, r, key, reply))
            return None
        if reply.status != 200 or not isinstance(reply.json().get("data"), list):
            code, msg = reply.error()
            self.add(
                _fail("base URL", f"GET {url} answered {reply.status}: {msg or code}.", "check the base URL.")
            )
            return None
        self.add(
            _pass("base URL", f"{r.base_url} is the gateway (from {r.base_from}; {reply.elapsed_ms:.0f} ms).")
        )
        allowed = [m["id"] for m in reply.json()["data"] if isinstance(m, dict) and "id" in m]
        if key is not None and key == r.key:
            self.add(_pass("auth", f"the gateway accepts the key; it may use {', '.join(allowed)}."))
        elif key is not None:
            self.add(_warn("auth", "the key works once cleaned as above; fix the variable."))
        return allowed

    def _suggest(self, root: str) -> str:
        return root_url(root) + ("" if self.anthropic_style else "/v1")

    async def wrong_base(self, probe: Prober, r: Resolved, key: str | None) -> None:
        base = r.base_url.rstrip("/")
        has_v1 = base.endswith("/v1")
        right = self._suggest(base)
        var = {"claude-code": "ANTHROPIC_BASE_URL", "codex": "base_url in config.toml"}.get(
            self.inp.tool, "OPENAI_BASE_URL"
        )
        if right != base:
            alt = await probe.request("base URL", "GET", self.models_url(right), self.headers(key or "none"))
            if alt.status in (200, 401) and not alt.is_html():
                if self.anthropic_style:
                    why = "Claude Code and the anthropic SDK add /v1 themselves, so they call /v1/v1/messages"
                else:
                    why = (
                        f"the openai SDK and Codex expect the /v1 in the base URL, so they call {base}/models"
                    )
                self.add(
                    _fail(
                        "base URL",
                        f"404 from {base} ({'with' if has_v1 else 'without'} /v1): {why}.",
                        f"set {var} to {right}.",
                    )
                )
                return
        self.add(
            _fail(
                "base URL",
                f"404 from {self.models_url(base)}: no gateway API at {base}, with or without /v1 (a proxy "
                "path prefix, another service on that port?).",
                f"use the address the gateway listens on, e.g. {self._suggest(self.inp.default_base_url)}.",
            )
        )

    def call(self, r: Resolved, model: str) -> tuple[str, dict]:
        base = r.base_url.rstrip("/")
        if self.inp.tool == "claude-code":
            body = {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "ping"}]}
            return base + "/v1/messages", body
        if self.inp.tool == "codex":
            return base + "/responses", {"model": model, "input": "ping", "max_output_tokens": 16}
        body = {"model": model, "max_completion_tokens": 1, "messages": [{"role": "user", "content": "ping"}]}
        return base + "/chat/completions", body

    async def model_call(self, probe: Prober, r: Resolved, key: str, allowed: list[str]) -> None:
        # No model configured: try the allowed ones in order until one answers in the tool's own format
        # (one reached through translation is remembered for the translation check).
        candidates = [r.model] if r.model else allowed
        if not candidates:
            self.add(_fail("model", "the key's project has no models.", "ask the admin to configure some."))
            return
        h = {**self.headers(key), "X-Farm-Task": "doctor"}
        translated: tuple[str, Reply] | None = None
        tried = 0
        for model in candidates:
            url, body = self.call(r, model)
            reply = await probe.request("model call", "POST", url, h, body)
            tried += 1
            if r.model or reply.status != 200 or not reply.headers.get("x-farm-translation"):
                break
            translated = translated or (model, reply)
        else:
            model, reply = translated  # type: ignore[misc]  # every model is of the other format
        where = f" (from {r.model_from})" if r.model_from else ""
        listing = ", ".join(allowed)
        if reply.status == 200:
            how = reply.headers.get("x-farm-translation")
            via = f" through the gateway's translation ({how})" if how else ""
            self.add(_pass("model call", f"{model}{where} answered{via} in {reply.elapsed_ms:.0f} ms."))
            if not r.model:
                await self.translation(probe, r, h, candidates[tried:], translated)
            shape = await check_shape(probe, self.inp.tool, r.base_url, h, model)
            if shape is not None:
                self.add(shape)
            return
        code, msg = reply.error()
        setting = {"claude-code": "ANTHROPIC_MODEL", "codex": "model in config.toml"}.get(
            self.inp.tool, "--model / your script's model"
        )
        if reply.status == 403 and code == "model_not_allowed":
            self.add(
                _fail(
                    "model call",
                    f"403: your key's project may not use {model}{where}; it may use {listing}.",
                    f"set {setting} to one of those, or ask the admin to add {model} to the project.",
                )
            )
        elif reply.status == 404:
            self.add(
                _fail(
                    "model call",
                    f"404: the gateway has no model {model!r}{where} ({msg}); your key may use {listing}.",
                    f"set {setting} to one of those.",
                )
            )
        elif reply.status == 429:
            self.add(await rate_limited(self.inp, reply, key))
        elif reply.status == 504:
            self.add(
                _fail(
                    "model call",
                    f"504: the upstream sent nothing within the gateway's read timeout ({msg}).",
                    TIMEOUT_FIX,
                )
            )
        elif reply.status == 502:
            self.add(
                _fail(
                    "model call",
                    f"502: the gateway cannot reach its upstream provider ({msg}).",
                    "an admin problem: check the provider's base_url and network on the gateway host.",
                )
            )
        elif reply.status in (401, 403):
            self.add(
                _fail(
                    "model call",
                    f"{reply.status} from the upstream provider ({msg}): the gateway's upstream key is bad.",
                    "an admin problem: set the provider's api_key_env variable where the gateway runs.",
                )
            )
        else:
            self.add(
                _fail(
                    "model call",
                    f"{reply.status}: {msg or code}.",
                    "retry later; if it persists, report the x-request-id "
                    f"{reply.headers.get('x-request-id', '')} to the admin.",
                )
            )

    async def translation(
        self,
        probe: Prober,
        r: Resolved,
        h: dict[str, str],
        rest: list[str],
        seen: tuple[str, Reply] | None,
    ) -> None:
        """The translation path: a model this tool reaches through translation answered (``seen``), else
        the first of the untried models ``rest`` that the gateway translates; no line when none does."""
        for model in rest:
            if seen is not None:
                break
            url, body = self.call(r, model)
            reply = await probe.request("translation", "POST", url, h, body)
            if reply.status != 200:
                code, msg = reply.error()
                self.add(
                    _fail(
                        "translation",
                        f"{model} answered {reply.status}: {msg or code}.",
                        f"report the x-request-id {reply.headers.get('x-request-id', '')} to the admin.",
                    )
                )
                return
            if reply.headers.get("x-farm-translation"):
                seen = (model, reply)
        if seen is not None:
            model, reply = seen
            how = reply.headers["x-farm-translation"]
            self.add(
                _pass(
                    "translation",
                    f"{model} is served in another wire format; the gateway translates ({how}) and it "
                    f"answered in {reply.elapsed_ms:.0f} ms.",
                )
            )


async def run_doctor(inp: DoctorInput) -> list[Check]:
    return await Doctor(inp).run()
