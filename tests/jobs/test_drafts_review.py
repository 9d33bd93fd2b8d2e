"""The review of drafts (issue 33): drafts that carry a check in the card's grammar, `farm drafts list`,
`review`, `check` and `promote` into a metric card that `farm accept` then enforces; a rejected anomaly
is not sent to the model again."""

from __future__ import annotations

import asyncio
import json
import shutil
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from benchmarks.acceptance_bench import SPEC, seed_job
from gateway.summaries.offline import offline_drafts
from gateway.summaries.schema import AnomalyIn
from jobs.cli import main
from jobs.drafts import client as drafts_client
from jobs.drafts.client import draft_job
from jobs.drafts.compress import compress, facts_from_job
from jobs.drafts.review import ReviewError, check_on_job, list_drafts, promote, review
from jobs.spec.cards import CARDS_DIR, load_card, parse_check
from jobs.store import AnomalyRecord
from jobs.store.results import result_of
from tests.jobs.test_drafts import (  # the gateway with a fake model
    gateway_with_fake_model,
    live,  # noqa: F401
    model_reply,
)

M256 = {"m": 256, "n": 128, "k": 128}


def cli(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args])


def by_kind(store, job_id: int) -> dict[str, object]:
    kinds = {a.fingerprint: a.kind for a in store.anomalies(job_id)}
    return {kinds[d.fingerprints[0]]: d for d in list_drafts(store, job_id)}


def noisy_job(store) -> int:
    """A job whose one trial (the baseline backend at m=256) is correct but noisy: cv about 0.29 over
    the card's CPU limit of 0.25, which the card's own stability check only warns about on a CPU."""
    trial = SimpleNamespace(
        key="k0", family="gemm", backend="torch_fp32", baseline=True, shape=M256, config={}, dtype="float32"
    )
    job_id = store.create_job(
        name="gemm-accept", family="gemm", spec_yaml=SPEC, spec_hash="review", trials=[trial], git_commit="b"
    )
    (row,) = store.trials(job_id)
    store.record_results([result_of(row.id, [100_000] * 10 + [180_000] * 10, correct=True)])
    return job_id


# ---- drafts that can be checked --------------------------------------------------------------------
def test_offline_drafts_carry_checks_that_validate_against_the_card(store):
    job_id = seed_job(store)
    draft_job(store, job_id, use_env=False)
    drafts = by_kind(store, job_id)
    noisy = drafts["noisy"].check_spec
    assert noisy == {
        "metric": "cv",
        "op": "<=",
        "threshold": 0.25,
        "scope": {"family": "gemm", "backend": "torch_fp32", "shapes": [M256], "dtype": "float32"},
    }
    assert drafts["correctness"].check_spec["metric"] == "correct"
    assert drafts["timeout"].check_spec["metric"] == "completes"
    assert drafts["slower"].check_spec["metric"] == "ratio"
    card = load_card("gemm")
    for d in drafts.values():
        assert d.check_error is None
        parse_check(d.check_spec, card)  # the card schema takes every one


def test_a_check_that_does_not_validate_keeps_the_prose_and_says_why(store, monkeypatch):
    job_id = seed_job(store)
    real = drafts_client.offline_reply

    def bad_checks(items, task):
        reply = real(items, task)
        for d in reply["drafts"]:
            d["check"] = {"metric": "speed", "op": "<=", "threshold": 1}
        reply["drafts"][0]["check"] = "cv under a quarter"  # not even a mapping
        return reply

    monkeypatch.setattr(drafts_client, "offline_reply", bad_checks)
    draft_job(store, job_id, use_env=False)
    rows = list_drafts(store, job_id)
    assert rows and all(r.check_spec is None and r.assertion.startswith("[offline]") for r in rows)
    assert "metric" in rows[1].check_error and "speed" in rows[1].check_error
    assert "expected a mapping of check fields" in rows[0].check_error
    out = cli("drafts", "check", rows[1].id, "--db", store.url)
    assert out.exit_code == 2 and "does not validate" in out.output


async def test_model_checks_are_validated_against_the_jobs_card(store, live):  # noqa: F811
    fake, target = live

    def with_check(body):
        reply = json.loads(model_reply(body))
        for d in reply["drafts"]:
            d["check"] = {"metric": "completes", "op": "==", "threshold": 1, "scope": {"family": "attention"}}
        reply["drafts"][0]["check"]["scope"] = {"backend": "torch_fp32"}
        return json.dumps(reply)

    fake.reply = with_check
    job_id = seed_job(store)
    await asyncio.to_thread(draft_job, store, job_id, target=target)
    rows = list_drafts(store, job_id)
    assert fake.requests == 1 and len(rows) == 5
    assert rows[0].check_spec == {
        "metric": "completes",
        "op": "==",
        "threshold": 1.0,
        "scope": {"backend": "torch_fp32"},
    }
    assert all(r.check_spec is None and "card gemm is for gemm" in r.check_error for r in rows[1:])


def test_offline_drafts_of_a_cpu_job_say_what_a_cpu_allows(store):
    job_id = seed_job(store)  # no GPU environment stored: CPU timings
    items = compress(facts_from_job(store, job_id)).items
    assert {i["device"] for i in items} == {"cpu"}
    drafts = offline_drafts([AnomalyIn.model_validate(i) for i in items], "checklist")
    text = json.dumps([d.model_dump() for d in drafts])
    assert "SM clock" not in text and "measured None" not in text and "pin the GPU clock" not in text
    noisy = next(d for d in drafts if "noisy" in d.assertion)
    assert "--gpus 1" in noisy.verify_how and "cpu.max_cv" in noisy.verify_how
    gpu = AnomalyIn.model_validate({**next(i for i in items if i["kind"] == "noisy"), "device": "gpu"})
    assert "SM clock" in offline_drafts([gpu], "checklist")[0].verify_how
    # every kind of anomaly on a CPU job: no GPU clock to lock or record; a profiler only where deciding
    # needs a GPU host, and then the advice says so
    base = next(i for i in items if i["kind"] == "noisy")
    kinds = [
        "ambiguous",
        "throttled",
        "timeout",
        "hw_fraction",
        "resource",
        "slower",
        "correctness",
        "memory",
    ]
    for kind in kinds:
        (d,) = offline_drafts([AnomalyIn.model_validate({**base, "kind": kind})], "checklist")
        for gpu_only in ("SM clock", "clocks locked", "pin the GPU clock", "measured None"):
            assert gpu_only not in d.verify_how + d.assertion, (kind, d.verify_how)
        assert not d.needs_local_profiler or "GPU host" in d.verify_how, (kind, d.verify_how)
    (timeout,) = offline_drafts([AnomalyIn.model_validate({**base, "kind": "timeout"})], "checklist")
    assert not timeout.needs_local_profiler  # a stall on a CPU is read from its stderr, not a profiler


# ---- review, check, promote: the four commands --------------------------------------------------------
def test_from_anomalies_to_an_enforced_card_assertion_in_four_commands(store, tmp_path, monkeypatch):
    monkeypatch.delenv("FARM_GATEWAY_KEY", raising=False)
    job_id = noisy_job(store)
    # 1. run: the verdict (on CPU timings the shipped card only warns about the noise) and its drafts
    out = cli("accept", job_id, "--drafts", "--db", store.url)
    assert out.exit_code == 0 and "drafts (checklist, offline drafter)" in out.output, out.output
    assert [a.kind for a in store.anomalies(job_id)] == ["noisy"]
    # 2. list
    out = cli("drafts", "list", job_id, "--db", store.url)
    assert out.exit_code == 0, out.output
    (noisy,) = json.loads(cli("drafts", "list", job_id, "--json", "--db", store.url).output)
    assert noisy["state"] == "new" and noisy["check_spec"]["metric"] == "cv"
    assert f"│ {noisy['id']} " in out.output and f"noisy {noisy['fingerprints'][0][:12]}" in out.output
    assert "cv <= 0.25 on backend=torch_fp32" in out.output
    # its check, run on its own job, does not hold there
    out = cli("drafts", "check", noisy["id"], "--db", store.url)
    assert out.exit_code == 1 and "cv <= 0.25 does not hold on its job" in out.output
    # 3. review: promotion needs an accepted draft
    card = tmp_path / "gemm.yaml"
    shutil.copy(CARDS_DIR / "gemm.yaml", card)
    before = card.read_text()
    refused = cli("drafts", "promote", noisy["id"], "--card", card, "--db", store.url)
    assert refused.exit_code == 2 and "--accept" in refused.output and card.read_text() == before
    out = cli(
        "drafts", "review", noisy["id"], "--accept", "--reason", "cv holds on a quiet box", "--db", store.url
    )
    assert out.exit_code == 0 and "accepted" in out.output
    # 4. promote
    out = cli("drafts", "promote", noisy["id"], "--card", card, "--db", store.url)
    assert out.exit_code == 0, out.output
    text = card.read_text()
    assert text.startswith(before)  # every line, comment and layout of the card kept
    added = text[len(before) :]
    assert f"draft: {noisy['id']}  # draft {noisy['id']}, promoted " in added
    assert "metric: cv" in added and "threshold: 0.25" in added
    assert load_card(card).checks[0].draft == noisy["id"]
    again = cli("drafts", "promote", noisy["id"], "--card", card, "--db", store.url)
    assert again.exit_code == 2 and "already has this check" in again.output
    # `farm accept` enforces it: a noisy job that the shipped card only warns about now fails on it
    later = noisy_job(store)
    assert cli("accept", later, "--card", CARDS_DIR / "gemm.yaml", "--db", store.url).exit_code == 0
    out = cli("accept", later, "--card", card, "--json", "--db", store.url)
    assert out.exit_code == 1, out.output
    failed = [a for a in json.loads(out.output)["assertions"] if a["outcome"] == "fail"]
    assert [a["check"] for a in failed] == [f"draft-{noisy['id']}"]
    assert "cv 0.29" in failed[0]["reason"]
    bank = cli("failures", "list", "--db", store.url)
    assert f"draft-{noisy['id']}" in bank.output
    # and its check, run on that job, does not hold there
    out = cli("drafts", "check", noisy["id"], "--job", later, "--db", store.url)
    assert out.exit_code == 1 and "does not hold" in out.output


def test_drafts_check_says_whether_the_check_holds(store):
    job_id = seed_job(store)
    draft_job(store, job_id, use_env=False)
    drafts = by_kind(store, job_id)
    timeout = check_on_job(store, drafts["timeout"].id)  # completes == 1 on m=256: error and timeout fail
    assert timeout.counts == {"fail": 2, "pass": 1} and not timeout.holds
    clean = noisy_job(store)
    assert check_on_job(store, drafts["timeout"].id, clean).holds
    out = cli("drafts", "check", drafts["correctness"].id, "--db", store.url)
    assert out.exit_code == 1 and "correct == 1 does not hold" in out.output


def test_review_commands_refuse_bad_input(store, tmp_path):
    job_id = seed_job(store)
    draft_job(store, job_id, use_env=False)
    first = list_drafts(store, job_id)[0]
    out = cli("drafts", "review", first.id, "--db", store.url)
    assert out.exit_code == 2 and "--accept" in out.output
    assert cli("drafts", "review", 999, "--reject", "--db", store.url).exit_code == 2
    out = cli("drafts", "list", "--db", tmp_path / "nothing.db")
    assert (
        out.exit_code == 2 and not (tmp_path / "nothing.db").exists()
    )  # a read-only command creates nothing
    assert cli("drafts", "review", first.id, "--needs-profiler", "--db", store.url).exit_code == 0
    assert list_drafts(store, job_id)[0].state == "needs_profiler"


# ---- a rejected anomaly is not sent again ---------------------------------------------------------------
@pytest.fixture
def sent(monkeypatch) -> list[list[str]]:
    """The fingerprints of each call the offline drafter gets (it still answers)."""
    calls: list[list[str]] = []
    real = drafts_client.offline_reply

    def spy(items, task):
        calls.append([i["fingerprint"] for i in items])
        return real(items, task)

    monkeypatch.setattr(drafts_client, "offline_reply", spy)
    return calls


def test_a_rejected_anomaly_is_not_sent_to_the_model_again(store, sent):
    job_id = seed_job(store)
    draft_job(store, job_id, use_env=False)
    noisy = by_kind(store, job_id)["noisy"]
    out = cli("drafts", "review", noisy.id, "--reject", "--reason", "the box was busy", "--db", store.url)
    assert out.exit_code == 0
    again = draft_job(store, job_id, use_env=False)  # the same job drafted again
    assert again.skipped == noisy.fingerprints and noisy.fingerprints[0] not in sent[-1]
    assert len(sent[-1]) == len(sent[0]) - 1
    kept = {d.id: d for d in list_drafts(store, job_id)}
    assert kept[noisy.id].state == "rejected" and kept[noisy.id].reason == "the box was busy"
    assert len(kept) == 5  # the rejected one kept, the four others replaced
    later = seed_job(store)  # another job with the same anomaly
    assert draft_job(store, later, use_env=False).skipped == noisy.fingerprints
    assert noisy.fingerprints[0] not in sent[-1]
    # every anomaly rejected: no model call at all
    for d in list_drafts(store, later):
        review(store, d.id, "rejected")
    calls = len(sent)
    done = draft_job(store, later, use_env=False)
    assert len(sent) == calls and done.run_id is None and len(done.skipped) == 5


def test_a_rejected_anomaly_that_measures_something_new_is_sent_again(store, sent):
    """The skip is for the same content: the same point and kind with another measurement (a cv of 0.82
    where the rejected draft's anomaly had 0.31) is a new question for the model."""
    job_id = seed_job(store)
    draft_job(store, job_id, use_env=False)
    noisy = by_kind(store, job_id)["noisy"]
    review(store, noisy.id, "rejected", "the box was busy")
    later = seed_job(store)
    rows = []
    for a in store.anomalies(later):
        row = {k: getattr(a, k) for k in ("trial_id", "baseline_trial_id", "kind", "severity", "fingerprint")}
        row |= {"message": a.message, "evidence": a.evidence}
        if a.kind == "noisy":
            row |= {"message": "noisy: cv 0.82 over 60 samples", "evidence": {**a.evidence, "cv": 0.82}}
        rows.append(AnomalyRecord(**row))
    store.replace_anomalies(later, rows)
    again = draft_job(store, later, use_env=False)
    assert again.skipped == [] and noisy.fingerprints[0] in sent[-1]
    # drafted again with that content, and rejected: that content is not sent a third time
    renewed = by_kind(store, later)["noisy"]
    review(store, renewed.id, "rejected")
    assert draft_job(store, later, use_env=False).skipped == noisy.fingerprints


async def test_the_four_commands_through_the_gateway_and_no_model_call_for_a_rejected_anomaly(
    store, tmp_path, monkeypatch
):
    """Run, list, review --accept, promote with a model behind the gateway (its answer cache off, so
    every request that reaches the gateway is a model call): the promoted check fails a later noisy job;
    a rejected anomaly is not sent again, and no request reaches the model for it."""
    async with gateway_with_fake_model(tmp_path, cache_entries=0) as (fake, target):

        def with_checks(body):
            reply = json.loads(model_reply(body))
            for d in reply["drafts"]:
                d["check"] = {
                    "metric": "cv",
                    "op": "<=",
                    "threshold": 0.25,
                    "scope": {"backend": "torch_fp32"},
                }
            return json.dumps(reply)

        fake.reply = with_checks
        monkeypatch.setenv("FARM_GATEWAY_URL", target.base_url)
        monkeypatch.setenv("FARM_GATEWAY_KEY", target.api_key)

        async def farm(*args):
            return await asyncio.to_thread(cli, *args, "--db", store.url)

        job_id = noisy_job(store)
        out = await farm("accept", job_id, "--drafts")  # 1. run
        assert out.exit_code == 0 and "gpt-fake via" in out.output and fake.requests == 1, out.output
        (draft,) = json.loads((await farm("drafts", "list", job_id, "--json")).output)  # 2. list
        assert draft["check_spec"]["metric"] == "cv" and draft["state"] == "new"
        assert (await farm("drafts", "review", draft["id"], "--accept")).exit_code == 0  # 3. review
        card = tmp_path / "gemm.yaml"
        shutil.copy(CARDS_DIR / "gemm.yaml", card)
        assert (await farm("drafts", "promote", draft["id"], "--card", card)).exit_code == 0  # 4. promote
        later = noisy_job(store)
        out = await farm("accept", later, "--card", card, "--json")
        assert out.exit_code == 1, out.output
        failed = [a["check"] for a in json.loads(out.output)["assertions"] if a["outcome"] == "fail"]
        assert failed == [f"draft-{draft['id']}"]
        # the same anomaly drafted for the later job reaches the model (no cache), and is rejected there
        done = await asyncio.to_thread(draft_job, store, later)
        assert fake.requests == 2 and done.skipped == []
        (renewed,) = list_drafts(store, later)
        assert (await farm("drafts", "review", renewed.id, "--reject", "--reason", "busy box")).exit_code == 0
        third = noisy_job(store)  # the same anomaly, with the same content, once more
        out = await farm("accept", third, "--card", card, "--drafts")
        assert out.exit_code == 1 and "not sent" in out.output, out.output
        assert fake.requests == 2  # no model call for it
        assert list_drafts(store, third) == []


def test_promote_refuses_a_check_the_card_would_not_load(store, tmp_path):
    job_id = seed_job(store)
    draft_job(store, job_id, use_env=False)
    row = by_kind(store, job_id)["noisy"]
    review(store, row.id, "accepted")
    card = tmp_path / "probe.yaml"
    shutil.copy(CARDS_DIR / "probe.yaml", card)
    before = card.read_text()
    with pytest.raises(ReviewError, match="family"):
        promote(store, row.id, card)  # a gemm draft's check on the probe card
    assert card.read_text() == before
