"""`farm bench`: one point measured in this process (no Ray, no store), its exit codes and output."""

from __future__ import annotations

import json

from click.testing import CliRunner

from jobs.cli import main


def _bench(*args: str):
    return CliRunner().invoke(main, ["bench", *args], catch_exceptions=False)


def test_reference_backend_by_default_prints_the_measurement_and_correctness(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing may be written: no store, no .farm/
    out = _bench("gemm", "--shape", "m=32,n=32,k=32", "--max-time", "0.05")
    assert out.exit_code == 0, out.output
    assert "torch_fp32[m32xn32xk32 float32] on cpu: ok" in out.output
    assert "median" in out.output and "correctness.passed" in out.output and "tflops" in out.output
    assert list(tmp_path.iterdir()) == []


def test_json_has_the_outcome_rates_and_compiled_evidence_of_a_triton_trial():
    out = _bench("fp8_gemm", "--backend", "triton", "--shape", "m=64,n=64,k=128", "--config",
                 "block_m=32,block_n=32,block_k=64", "--max-time", "0.05", "--json")  # fmt: skip
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert doc["status"] == "ok" and doc["correctness"]["passed"] is True, doc
    assert doc["label"].startswith("triton[m64xn64xk128") and doc["summary"]["median"] > 0
    assert doc["rates"]["tflops"] > 0
    # in the interpreter nothing is compiled, and the evidence says why instead of pretending
    assert doc["compiled"]["checked"] is False and doc["compiled"]["reason"]


def test_bad_input_is_exit_2_naming_what_is_wrong():
    cases = [
        (["nope", "--shape", "m=1"], "unknown kernel family 'nope'"),
        (["gemm", "--shape", "m=32"], "shape"),
        (["gemm", "--shape", "m=32,n=32,k=32", "--backend", "cuda_magic"], "no backend 'cuda_magic'"),
        (["gemm", "--shape", "m32"], "expected K=V"),
    ]
    for args, needle in cases:
        out = CliRunner().invoke(main, ["bench", *args])
        assert out.exit_code == 2 and needle in out.output, (args, out.output)


def test_a_backend_that_replays_its_first_result_is_invalid_and_exit_1():
    # issue 45: every seed's output is checked before timing; the replayed result is caught after it
    out = _bench("adversarial", "--backend", "replay", "--shape", "m=8,n=16,k=8", "--max-time", "0.05")
    assert out.exit_code == 1, out.output
    assert "replay[m8xn16xk8 float32] on cpu: invalid (stale output: with its inputs refilled" in out.output
    honest = _bench("adversarial", "--shape", "m=8,n=16,k=8", "--max-time", "0.05")
    assert honest.exit_code == 0 and "honest[m8xn16xk8 float32] on cpu: ok" in honest.output
    # the level the CPU timing used, and the share of a core it got (kernels.measure.cpu_share)
    assert "wall time less each call's run-queue wait (got " in honest.output
