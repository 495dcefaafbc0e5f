"""Request identity and the access log: the client's ``x-request-id`` (or one the gateway makes)
comes back on every answer, goes upstream on every try, and names the request's one access-log line."""

from __future__ import annotations

import json
import logging
import re

import httpx
import openai
import pytest

from sagegate.gateway.access_log import AccessLog, request_id, upstream_id
from tests.gateway_support import fleet, wait_until

BODY = {"model": "fake", "messages": [{"role": "user", "content": "a secret prompt"}], "max_tokens": 8}
HEX = re.compile(r"[0-9a-f]{32}")


def access_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, object]]:
    return [json.loads(r.getMessage()) for r in caplog.records if r.name == "sagegate.access"]


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        ("req-42", True),
        ("a" * 128, True),
        ("a" * 129, False),
        ("has space", False),
        ("", False),
        (None, False),
    ],
)
def test_a_sane_client_id_is_kept_and_any_other_replaced(given: str | None, kept: bool) -> None:
    got = request_id({} if given is None else {"x-request-id": given})
    assert (got == given) if kept else HEX.fullmatch(got)
    assert upstream_id("r", 0) == "r" and upstream_id("r", 2) == "r.2"


def test_the_id_comes_back_goes_upstream_and_names_the_access_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sagegate.access")
    with fleet({"tokens": 5}, access_log="json") as ([fake], url):
        whole = httpx.post(url + "/v1/chat/completions", json=BODY, headers={"x-request-id": "req-1"})
        assert whole.status_code == 200 and whole.headers["x-request-id"] == "req-1"
        oai = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
        raw = oai.chat.completions.with_raw_response.create(
            model="fake", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        made = raw.headers["x-request-id"]
        list(raw.parse())
        assert HEX.fullmatch(made)
        assert [h.get("x-request-id") for h in fake.state.headers] == ["req-1", made]
        # a stream's line is written when the gateway settles it, just after the client's last byte
        wait_until(lambda: made in {line["id"] for line in access_lines(caplog)}, what="the stream's line")
        lines = access_lines(caplog)
    by_id = {line["id"]: line for line in lines}
    first = by_id["req-1"]
    assert first["status"] == 200 and first["outcome"] == "ok" and first["tenant"] == "default"
    assert first["output_tokens"] == 5 and first["prompt_tokens"] > 0 and first["retries"] == 0
    assert first["backend"] and first["ttlt_s"] >= first["ttft_s"] >= first["queue_s"] >= 0  # type: ignore[operator]
    assert by_id[made]["status"] == 200
    assert "a secret prompt" not in json.dumps(lines)


def test_refusals_carry_the_id_and_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sagegate.access")
    with fleet({}, access_log="json") as (_, url):
        bad = httpx.post(
            url + "/v1/chat/completions", json={"model": "fake"}, headers={"x-request-id": "bad-1"}
        )
        missing = httpx.post(url + "/v1/chat/completions", json={**BODY, "model": "nope"})
        assert bad.status_code == 400 and bad.headers["x-request-id"] == "bad-1"
        assert missing.status_code == 404 and HEX.fullmatch(missing.headers["x-request-id"])
        lines = {line["id"]: line for line in access_lines(caplog)}
    assert lines["bad-1"]["status"] == 400
    assert lines[missing.headers["x-request-id"]]["status"] == 404


def test_a_retry_goes_upstream_under_a_numbered_id() -> None:
    with fleet({"mode": "fail500"}, {"mode": "fail500"}, upstream={"max_attempts": 2}) as (fakes, url):
        r = httpx.post(url + "/v1/chat/completions", json=BODY, headers={"x-request-id": "try"})
        assert r.status_code == 502 and r.headers["x-request-id"] == "try"
        seen = sorted(h["x-request-id"] for f in fakes for h in f.state.headers)
    assert seen == ["try", "try.1"]


def test_the_text_format_quotes_what_needs_it_and_off_writes_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="sagegate.access")
    AccessLog("text").write({"id": "x", "tenant": "a b", "model": None, "ttlt_s": 0.123456})
    AccessLog("off").write({"id": "y"})
    assert [r.getMessage() for r in caplog.records] == ['id=x tenant="a b" ttlt_s=0.1235']
