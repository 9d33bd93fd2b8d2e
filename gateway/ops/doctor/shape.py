"""The client's own request shape through the model's translation: the request recorded from the real
client (gateway/ops/client_shapes/, its second turn: tools, a tool call and its result) sent to the gateway
as a dry run (``X-Farm-Dry-Run: translation``), which answers what each of the model's deployments would be
sent, without sending it: the translation and the fields it would drop, or the 400 of one it would refuse."""

from __future__ import annotations

import json
from pathlib import Path

from gateway.ops.doctor.checks import Check, _fail, _pass, _warn
from gateway.ops.doctor.probe import Prober

SHAPES = Path(__file__).resolve().parents[1] / "client_shapes"
# the tools whose recorded shape the doctor replays -> (recording, path after the tool's base URL)
SHAPE_OF = {"claude-code": ("claude-code", "/v1/messages"), "codex": ("codex", "/responses")}
DRY_RUN = {"X-Farm-Dry-Run": "translation"}
NAME = "client shape"


def recorded_request(tool: str, model: str) -> tuple[str, str, dict]:
    """(client, version, body): the tool's recorded second request, for ``model``, whole and small (a
    gateway without the dry run would send it: the fewest output tokens its format allows)."""
    client, _ = SHAPE_OF[tool]
    doc = json.loads((SHAPES / f"{client}.json").read_text())
    body = {**doc["requests"][1], "model": model, "stream": False}
    if doc["format"] == "responses":
        body["max_output_tokens"] = 16
    else:
        body["max_tokens"] = 1
    return client, doc["version"], body


async def check_shape(probe: Prober, tool: str, base_url: str, headers: dict, model: str) -> Check | None:
    """One check: PASS when every deployment of ``model`` takes the tool's request as it is or translated
    with nothing dropped, WARN naming what translation would drop, FAIL naming what it would refuse; None
    for a tool without a recorded shape."""
    if tool not in SHAPE_OF:
        return None
    client, version, body = recorded_request(tool, model)
    url = base_url.rstrip("/") + SHAPE_OF[tool][1]
    reply = await probe.request(NAME, "POST", url, {**headers, **DRY_RUN}, body)
    what = f"{client} {version}'s request (tools, a tool call and its result) on {model}"
    if reply.status == 400:
        _code, msg = reply.error()
        return _fail(
            NAME,
            f"{what} would be refused: {msg}.",
            "use a model served in the client's own format, or ask the admin for a deployment that is.",
        )
    data = reply.json()
    if reply.status != 200 or data.get("object") != "farm.dry_run":
        code, msg = reply.error()
        return _warn(NAME, f"the gateway did not answer the dry run ({reply.status}: {msg or code}).",
                     "upgrade the gateway to one that knows X-Farm-Dry-Run.")  # fmt: skip
    plain, translated, lossy = [], [], []
    for d in data["deployments"]:
        if not d["translation"]:
            plain.append(d["deployment"])
        elif d["dropped"]:
            lossy.append(f"{d['deployment']} ({d['translation']}) would drop {', '.join(d['dropped'])}")
        else:
            translated.append(f"{d['deployment']} ({d['translation']})")
    parts = ([f"sent as it is to {', '.join(plain)}"] if plain else []) + (
        [f"translated with nothing dropped for {', '.join(translated)}"] if translated else []
    )
    if lossy:
        rest = "".join(f"; {p}" for p in parts)
        return _warn(
            NAME,
            f"{what}: {'; '.join(lossy)} (dropped and reported, the answer still comes){rest}.",
            "nothing to do unless the client needs those; a project with translation: strict refuses "
            "them instead.",
        )  # fmt: skip
    return _pass(NAME, f"{what}: {'; '.join(parts)}.")
