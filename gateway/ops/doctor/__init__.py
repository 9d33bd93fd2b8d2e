"""``farm gateway doctor``: find why a client cannot use the gateway, and say how to fix it.

It reads the settings the chosen tool would use (environment, Codex ``config.toml``, Claude Code
``settings.json``), checks the key locally, then runs two cheap probes exactly as the tool would: GET the
model list and one request with the smallest output (``max_tokens=1``; Responses ``max_output_tokens=16``,
the least OpenAI accepts). Every result becomes one line: PASS, WARN or FAIL, the cause in plain words and
the fix. Any FAIL makes the command exit non-zero.

Translation: the gateway serves any model to any tool, translating between wire formats when the model's
provider speaks another one (it then answers with ``x-farm-translation: messages->chat``). Without a
configured model the doctor calls the allowed models in order until one answers in the tool's own format
(the "model call" line), and checks the translation path with one tiny call to a model the tool reaches
through translation (the "translation" line: which model, which translation), when the project has one.

The package, one job a module: ``checks`` the report's lines · ``inputs`` what the doctor is asked and
what the tool would use · ``settings`` reading each tool's settings · ``key`` the key, locally and in the
gateway's store · ``probe`` HTTP requests as the tool sends them · ``refusals`` what a 401 or a 429 means
· ``run`` the run itself. This module is its public face.
"""

from gateway.ops.doctor.checks import Check, Status, failed, format_checks
from gateway.ops.doctor.inputs import DOCTOR_TOOLS, DoctorInput, DoctorTool, KeyLookup, Resolved
from gateway.ops.doctor.key import check_key, store_lookup
from gateway.ops.doctor.probe import TIMEOUT_FIX
from gateway.ops.doctor.refusals import advise_429
from gateway.ops.doctor.run import Doctor, run_doctor

__all__ = [
    "DOCTOR_TOOLS",
    "TIMEOUT_FIX",
    "Check",
    "Doctor",
    "DoctorInput",
    "DoctorTool",
    "KeyLookup",
    "Resolved",
    "Status",
    "advise_429",
    "check_key",
    "failed",
    "format_checks",
    "run_doctor",
    "store_lookup",
]
