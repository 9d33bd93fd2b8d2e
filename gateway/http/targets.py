"""The step before the exchange, written once for every model call: the proxy endpoints'
(gateway.http.endpoints.proxy) and the summaries batcher's (gateway.http.endpoints.summaries).

- ``check_model``: the public model exists and the project may use it (404 / 403 otherwise);
- ``TargetRequests``: what each target of the routing plan (a deployment, gateway.upstream.routing) is
  sent. A target of the client's own provider kind gets the client's body with its upstream model id
  (encoded once per id). Any other target gets the body translated (gateway.translate) into its kind's
  format, ``UPSTREAM_FORMAT`` (every OpenAI-compatible API has chat completions), on that format's path and
  with the client's headers less the other kind's (``translated_headers``: a beta flag only unlocks request
  fields, and every field the body uses is translated or refused by name). A target of an anthropic
  deployment with automatic prompt caching (``auto_cache``, gateway.translate.cache_points) gets cache
  breakpoints when the body, native or translated, carries none. ``note`` writes on the record where the
  request went;
- ``upstream_error``: an upstream's own error answer as the gateway's error, noted on the record.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gateway.errors import (
    ApiStyle,
    BadRequest,
    Forbidden,
    NotFound,
    UpstreamCredentialRejected,
    UpstreamError,
)
from gateway.http.pipeline import credential_refused, dump_json
from gateway.translate import Format, translate_request
from gateway.translate.api import ANTHROPIC_VERSION
from gateway.translate.cache_points import add_breakpoints, has_cache_control
from gateway.upstream.client import client_retry_after

if TYPE_CHECKING:
    from gateway.config import ProjectConfig
    from gateway.core.record import Record
    from gateway.upstream.client import UpstreamResult
    from gateway.upstream.routing import Deployment, ModelDeployments, RoutePlan, Router

# A target whose provider kind is not the client's gets this format, on this path.
UPSTREAM_FORMAT: dict[str, Format] = {"anthropic": "messages", "openai": "chat"}
UPSTREAM_PATH = {"messages": "/messages", "chat": "/chat/completions"}
# Headers that only mean something to one provider kind: not sent to a target of another kind.
_KIND_HEADERS = ("anthropic-version", "anthropic-beta", "openai-beta")
_NO_CACHE: Mapping[tuple[str, str], int] = {}  # no deployment gets automatic breakpoints (never written)


def check_model(router: Router, project: ProjectConfig, project_name: str, model: str) -> ModelDeployments:
    """The deployments of public ``model``: a 404 when it does not exist, a 403 when the project may not use
    it."""
    models = router.models.get(model)
    if models is None:
        raise NotFound(f"model {model!r} does not exist", error_class="model_unknown", code="model_not_found")
    if model not in project.models:
        raise Forbidden(
            f"project {project_name!r} is not allowed to use model {model!r}",
            error_class="model_forbidden",
            code="model_not_allowed",
        )
    return models


def translation_of(target: Deployment, fmt: Format, style: ApiStyle) -> str | None:
    """ "messages->chat" for a target of another format than the client's (``fmt``, spoken by providers of
    kind ``style``); None for its own."""
    return None if target.kind == style else f"{fmt}->{UPSTREAM_FORMAT[target.kind]}"


def translated_headers(headers: Mapping[str, str], kind: str) -> dict[str, str]:
    """The client's headers for a target of provider ``kind`` that is not the client's: the other kind's
    version and beta flags dropped, ``anthropic-version`` set for Anthropic (the client's, if it sent one)."""
    out = {k: v for k, v in headers.items() if k not in _KIND_HEADERS}
    if kind == "anthropic":
        out["anthropic-version"] = headers.get("anthropic-version", ANTHROPIC_VERSION)
    return out


class TargetRequests:
    """What each target of one request's plan is sent (the plan's ``prepare``): for a target of the client's
    own kind (``style``) the body with its upstream model id, plus ``native_fields`` (bytes, on the request's
    own path and headers; ``encoded``: bodies already encoded, by upstream model id); for any other the
    translated (path, body, headers), made once per format, upstream model and effort, with the fields the
    translation dropped (``dropped``). ``auto_cache``: (public model, upstream model) of the anthropic
    deployments that get prompt-cache breakpoints -> the shortest prefix worth one."""

    __slots__ = (
        "body", "fmt", "style", "headers", "model", "default_max_tokens", "strict", "native_fields",
        "auto_cache", "_native", "_translated", "_dropped",
    )  # fmt: skip

    def __init__(
        self,
        body: dict[str, Any],
        fmt: Format,
        style: ApiStyle,
        headers: Mapping[str, str],
        *,
        model: str,
        default_max_tokens: int,
        strict: bool = False,
        native_fields: Mapping[str, Any] | None = None,
        encoded: dict[str, bytes] | None = None,
        auto_cache: Mapping[tuple[str, str], int] = _NO_CACHE,
    ) -> None:
        self.body, self.fmt, self.style, self.headers = body, fmt, style, headers
        self.model = model  # the public model asked for
        self.default_max_tokens, self.strict = default_max_tokens, strict
        self.native_fields = native_fields or {}
        self.auto_cache = auto_cache
        self._native: dict[str, bytes] = encoded if encoded is not None else {}
        self._translated: dict[tuple[str, str, bool, int | None], tuple[str, bytes, dict[str, str]]] = {}
        self._dropped: dict[tuple[str, str, bool], list[str]] = {}

    def __call__(self, target: Deployment) -> bytes | tuple[str, bytes, dict[str, str]]:
        if target.kind != self.style:
            return self.translated(target)
        if self.auto_cache and (target.model, target.upstream_model) in self.auto_cache:
            return self._native_cached(target, self.auto_cache[(target.model, target.upstream_model)])
        out = self._native.get(target.upstream_model)
        if out is None:
            body = {**self.body, "model": target.upstream_model, **self.native_fields}
            out = self._native[target.upstream_model] = dump_json(body)
        return out

    def _native_cached(self, target: Deployment, min_tokens: int) -> bytes:
        """The client's own (Messages) body for an anthropic deployment with automatic prompt caching: with
        breakpoints where the client set none and they pay, else as for any other deployment."""
        key = f"{target.upstream_model}\0cache{min_tokens}"
        out = self._native.get(key)
        if out is None:
            body = {**self.body, "model": target.upstream_model, **self.native_fields}
            cached = None if has_cache_control(body) else add_breakpoints(body, min_tokens)
            if cached is None:
                out = self._native.get(target.upstream_model) or dump_json(body)
            else:
                out = dump_json(cached)
            self._native[key] = out
        return out

    def request(self, target: Deployment, path: str) -> tuple[str, bytes, Mapping[str, str]]:
        """What ``target`` is sent as (path, body, headers), the request's own ``path`` for its own kind."""
        out = self(target)
        return (path, out, self.headers) if isinstance(out, bytes) else out

    def translated(self, target: Deployment) -> tuple[str, bytes, dict[str, str]]:
        """The request for a target of another kind; a field it cannot take is a 400 naming it (and the
        fallback model, when the target serves one)."""
        dst = UPSTREAM_FORMAT[target.kind]
        base = (dst, target.upstream_model, target.effort)
        min_tokens = self.auto_cache.get((target.model, target.upstream_model)) if dst == "messages" else None
        key = (*base, min_tokens)
        out = self._translated.get(key)
        if out is None:
            dropped = self._dropped[base] = []
            try:
                tb = translate_request(
                    self.body, self.fmt, dst, upstream_model=target.upstream_model,
                    default_max_tokens=self.default_max_tokens, strict=self.strict, dropped=dropped,
                    effort=target.effort,
                )  # fmt: skip
            except BadRequest as e:
                if target.model != self.model:  # a fallback model's format: say which
                    e.message = f"fallback model {target.model!r} ({target.kind}): {e.message}"
                raise
            if min_tokens is not None and not has_cache_control(tb):
                tb = add_breakpoints(tb, min_tokens) or tb
            out = (UPSTREAM_PATH[dst], dump_json(tb), translated_headers(self.headers, target.kind))
            self._translated[key] = out
        return out

    def check(self, models: ModelDeployments) -> None:
        """The translations the model's own deployments need, made now: a field one of them cannot take is
        a 400 before any upstream call."""
        for d in models.deployments:
            if d.kind != self.style:
                self.translated(d)

    def upstream_format(self, target: Deployment) -> Format:
        return self.fmt if target.kind == self.style else UPSTREAM_FORMAT[target.kind]

    def translation(self, target: Deployment) -> str | None:
        return translation_of(target, self.fmt, self.style)

    def dropped(self, target: Deployment) -> list[str]:
        """The request fields the target's translation left out (none for the client's own format)."""
        if target.kind == self.style:
            return []
        return self._dropped.get((UPSTREAM_FORMAT[target.kind], target.upstream_model, target.effort), [])

    def note(self, rec: Record, plan: RoutePlan) -> None:
        """The ledger's view of where the request went: the final attempt's deployment, the public model
        asked for when a fallback served it, the translation and the fields it dropped."""
        target = plan.target
        if target is None:
            return
        rec.deployment, rec.provider = target.name, target.provider
        rec.upstream_model = target.upstream_model
        if plan.fallback_from is not None:
            rec.fallback_from = plan.fallback_from
        rec.translation = self.translation(target)
        rec.dropped = self.dropped(target)


def upstream_error(rec: Record, result: UpstreamResult) -> UpstreamError:
    """An upstream's own error answer (status 400 or more) as the gateway's error, noted on the record
    (``upstream_<status>``): the upstream's status and Retry-After, a message naming the provider and the
    start of its body. A 401 or 403 refused the gateway's own provider key, not the caller's: a 502 saying
    so (``UpstreamCredentialRejected``), the upstream's body kept here."""
    rec.upstream_end = time.perf_counter()
    status = result.status
    rec.fail("error", status, f"upstream_{status}")
    if status in (401, 403):
        rec.http_status = 502
        return UpstreamCredentialRejected(
            credential_refused(rec.provider, status), code="upstream_credential_rejected"
        )
    detail = (result.body or b"")[:500].decode("utf-8", "replace").strip()
    err = UpstreamError(
        f"upstream {rec.provider!r} returned HTTP {status}" + (f": {detail}" if detail else ""),
        error_class=f"upstream_{status}",
        retry_after=client_retry_after(result.headers),
    )
    err.status = status
    return err
