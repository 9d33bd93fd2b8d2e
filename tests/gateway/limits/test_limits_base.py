"""The limits' interface and the one table of refusals (gateway.limits.base): the Redis admission script
refuses with the table's codes, and a refusal's Retry-After follows its rule."""

from __future__ import annotations

import re
import string

import pytest

from gateway.limits.base import BY_CODE, MIDNIGHT, ONE_SECOND, ROOM, RULES, LimitExceeded, refusal
from gateway.limits.redis_scripts import ADMIT

FIGURES = {
    "name": "alpha", "used": 7, "reserved": 3, "budget": 10, "rpm": 60, "tpm": 1000, "reserve": 300,
    "spent": 1.5, "max_concurrency": 4, "queue_timeout_s": 2.5,
}  # fmt: skip


def test_the_admission_scripts_refusal_codes_are_the_tables():
    codes = {int(c) for c in re.findall(r"return \{2, (\d+),", ADMIT.source)}
    assert codes == set(BY_CODE) == {1, 2, 3, 4, 5, 6}
    assert {RULES[reason].limit for reason in BY_CODE.values()} == {
        "daily_budget", "daily_cost_budget", "rpm", "tpm",
    }  # fmt: skip
    assert RULES["concurrency"].code == 0  # the queue wait runs out in Python, for both limiters


@pytest.mark.parametrize("reason", sorted(RULES))
def test_every_message_names_the_project_and_is_filled(reason):
    rule = RULES[reason]
    names = {f for _, f, _, _ in string.Formatter().parse(rule.message) if f}
    assert names <= set(FIGURES), names - set(FIGURES)
    e = refusal(reason, 42.0, **FIGURES)
    assert isinstance(e, LimitExceeded) and e.limit == rule.limit
    assert e.message.startswith("project 'alpha'") and "{" not in e.message
    assert e.retry_after_s == (1.0 if rule.retry == ONE_SECOND else 42.0)
    assert rule.retry in (ROOM, MIDNIGHT, ONE_SECOND)


def test_the_messages_clients_see():
    assert refusal("rpm", 2.2, **FIGURES).message == (
        "project 'alpha' is over its rate limit of 60 requests per minute"
    )
    assert refusal("tpm", 1, **FIGURES).message == (
        "project 'alpha' is over its rate limit of 1000 tokens per minute (this request reserves 300)"
    )
    assert refusal("daily_budget_spent", 1, **FIGURES).message == (
        "project 'alpha' has used its daily token budget (7/10 tokens)"
    )
    assert refusal("daily_cost_budget_reserved", 1, **{**FIGURES, "budget": 2}).message == (
        "project 'alpha': the requests in flight reserve the rest of its daily cost budget "
        "($1.5000 spent + $3.0000 reserved of $2)"
    )
    assert refusal("concurrency", **FIGURES).message == (
        "project 'alpha' has 4 requests in flight and the queue wait of 2.5 s ran out"
    )


def test_retry_after_is_whole_seconds_and_at_least_one():
    assert refusal("rpm", 2.2, **FIGURES).retry_after_header == "3"
    assert refusal("rpm", 0.0, **FIGURES).retry_after_header == "1"
    assert refusal("daily_budget_reserved", 3600, **FIGURES).retry_after_header == "1"
