"""Both credential headers at once, as Claude Code sends them with ANTHROPIC_API_KEY (the user's own Anthropic
key) and ANTHROPIC_AUTH_TOKEN (the gateway key) both set: the gateway key wins, and a refusal says which
header was used. Through the real SDKs over HTTP.

The installed anthropic SDK refuses ``api_key=`` together with ``auth_token=`` (and sends ``api_key`` as a
Bearer token), so the second header goes in as a default header, which is exactly what Claude Code sends.
"""

from __future__ import annotations

import anthropic
import openai
import pytest
from multidict import CIMultiDict

from gateway.store.keys import Credential, credential_from_headers, key_from_headers

MSGS = [{"role": "user", "content": "hi"}]
OWN_ANTHROPIC_KEY = "sk-ant-api03-" + "u" * 40  # the user's own key, which the gateway must ignore


@pytest.fixture
async def clients():
    made: list = []

    def anthropic_client(gw, *, auth_token: str, x_api_key: str) -> anthropic.AsyncAnthropic:
        c = anthropic.AsyncAnthropic(
            base_url=gw.url, auth_token=auth_token, default_headers={"x-api-key": x_api_key}, max_retries=0
        )
        made.append(c)
        return c

    def openai_client(gw, *, api_key: str, x_api_key: str) -> openai.AsyncOpenAI:
        c = openai.AsyncOpenAI(
            base_url=gw.v1, api_key=api_key, default_headers={"x-api-key": x_api_key}, max_retries=0
        )
        made.append(c)
        return c

    yield anthropic_client, openai_client
    for c in made:
        await c.close()


async def test_the_gateway_key_wins_over_the_users_own_anthropic_key(gateway, fake, clients):
    anthropic_client, openai_client = clients
    key = gateway.keys["alpha"]
    # Claude Code: ANTHROPIC_AUTH_TOKEN -> Authorization: Bearer, ANTHROPIC_API_KEY -> x-api-key
    msg = await anthropic_client(gateway, auth_token=key, x_api_key=OWN_ANTHROPIC_KEY).messages.create(
        model="claude-fake", max_tokens=8, messages=MSGS
    )
    assert msg.content
    # the other way round: the gateway key in x-api-key, something else as the Bearer token
    msg = await anthropic_client(gateway, auth_token=OWN_ANTHROPIC_KEY, x_api_key=key).messages.create(
        model="claude-fake", max_tokens=8, messages=MSGS
    )
    assert msg.content
    out = await openai_client(gateway, api_key=key, x_api_key=OWN_ANTHROPIC_KEY).chat.completions.create(
        model="gpt-fake", messages=MSGS
    )
    assert out.choices
    rows = await gateway.rows()
    assert [r["status"] for r in rows] == ["ok"] * 3 and {r["project"] for r in rows} == {"alpha"}
    # the user's own key never reaches the upstream
    assert all(OWN_ANTHROPIC_KEY not in str(s.headers) for s in fake.seen)


async def test_two_different_gateway_keys_authorization_wins_and_the_401_names_both_headers(
    gateway, fake, clients
):
    anthropic_client, openai_client = clients
    alpha, beta = gateway.keys["alpha"], gateway.keys["beta"]
    client = anthropic_client(gateway, auth_token=alpha, x_api_key=beta)
    await client.messages.create(model="claude-fake", max_tokens=8, messages=MSGS)  # alpha's model
    rows = await gateway.rows()
    assert rows[-1]["project"] == "alpha" and rows[-1]["key_id"] == alpha[3:15]

    assert await gateway.gw.keys.revoke(alpha[3:15])
    with pytest.raises(anthropic.AuthenticationError) as ai:  # no fallback to the other header's key
        await client.messages.create(model="claude-fake", max_tokens=8, messages=MSGS)
    message = ai.value.response.json()["error"]["message"]
    assert "both 'Authorization: Bearer' and 'x-api-key' were sent" in message
    assert "used 'Authorization: Bearer' and ignored 'x-api-key'" in message
    assert alpha not in message and beta not in message

    with pytest.raises(openai.AuthenticationError) as oi:  # a gateway key in x-api-key beats a foreign one
        await openai_client(gateway, api_key=OWN_ANTHROPIC_KEY, x_api_key=alpha).chat.completions.create(
            model="gpt-fake", messages=MSGS
        )
    message = oi.value.response.json()["error"]["message"]
    assert "used 'x-api-key' and ignored 'Authorization: Bearer'" in message
    assert fake.requests == 1


def test_credential_from_headers_rules():
    def cred(**h: str) -> Credential:
        return credential_from_headers(CIMultiDict({k.replace("_", "-"): v for k, v in h.items()}))

    gw1, gw2 = "kf_0123456789ab_" + "a" * 30, "kf_ba9876543210_" + "b" * 30
    assert cred(authorization=f"Bearer {gw1}", x_api_key=f" {gw1} ") == Credential(gw1, "authorization")
    assert cred(authorization=f"bearer {gw1}") == Credential(gw1, "authorization")
    assert cred(x_api_key=gw1) == Credential(gw1, "x-api-key")
    assert cred(authorization=f"Bearer {gw1}", x_api_key=gw2).key == gw1
    assert cred(authorization="Bearer sk-ant-x", x_api_key=gw2) == Credential(
        gw2, "x-api-key", "authorization"
    )
    assert cred(authorization="Basic abc", x_api_key="") == Credential(None)
    assert key_from_headers(CIMultiDict()) is None
    assert "were sent" not in cred(x_api_key=gw1).invalid_message()
