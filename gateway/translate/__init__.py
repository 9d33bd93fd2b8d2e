"""Wire-format translation: any client format on any upstream format.

Three formats, ``Format = Literal["chat", "responses", "messages"]``: OpenAI chat completions, OpenAI
Responses (Codex CLI) and Anthropic Messages (Claude Code). Each is read into and written from one small
hub representation (``ir``), so adding a format is two functions per direction, not six translators::

    translate_request(body, src, dst, upstream_model=..., default_max_tokens=...) -> dict
    translate_response(body, src, dst, public_model=...) -> dict
    translate_error(body, src, dst, status=...) -> dict
    StreamTranslator(src, dst, public_model=...).feed(chunk) / .finish() / .error_event(status, msg)
    stream_translator(src, dst, ...)   the one a pair needs: PassThrough for the client's own format

A feature the target cannot express raises ``gateway.errors.BadRequest`` with
``error_class="untranslatable"`` naming the field. Fields dropped on purpose (hints that do not change
the answer) are listed, each with its reason, in ``policy.DROPPED``. Pure functions, no I/O.
"""

from gateway.translate.api import DEFAULT_MAX_TOKENS, translate_error, translate_request, translate_response
from gateway.translate.ir import FORMAT_NAMES, FORMATS, Format
from gateway.translate.policy import DROPPED
from gateway.translate.stream import PassThrough, StreamTranslator, stream_translator

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "DROPPED",
    "FORMATS",
    "FORMAT_NAMES",
    "Format",
    "PassThrough",
    "StreamTranslator",
    "translate_error",
    "translate_request",
    "translate_response",
    "stream_translator",
]
