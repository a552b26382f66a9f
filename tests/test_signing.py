from __future__ import annotations

import base64
import copy
import hashlib
import hmac
import json
import logging
import os
import pickle
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import standardwebhooks
import structlog

from daemon.config import Secret, SecretError, load_secret
from daemon.delivery.errors import SignatureInvalid
from daemon.delivery.receiver import WebhookReceiver
from daemon.delivery.signing import sign, verify
from tests.deadlines import Deadline

KEY = bytes(range(32))
SECRET_TEXT = "whsec_" + base64.b64encode(KEY).decode()
SECRET = Secret(KEY)
BODY = b'{"type":"evald.alert","value":0.42}'
STAMP = 1_700_000_000


def _signed(body: bytes = BODY, *, secret: Secret = SECRET, stamp: int = STAMP) -> dict[str, str]:
    return sign(secret, "msg_2b7Xq", stamp, body)


# --- sign and verify ---


def test_a_signed_body_verifies() -> None:
    headers = _signed()
    assert set(headers) == {"webhook-id", "webhook-timestamp", "webhook-signature"}
    assert headers["webhook-timestamp"] == str(STAMP)
    verify(SECRET, headers, BODY, now=STAMP)


def test_the_signature_is_hmac_sha256_of_id_timestamp_and_body() -> None:
    # Computed here from the spec's definition, independently of the module's code path.
    expected = hmac.new(KEY, b"msg_2b7Xq.1700000000." + BODY, hashlib.sha256).digest()
    assert _signed()["webhook-signature"] == "v1," + base64.b64encode(expected).decode()


def test_the_reference_library_accepts_our_signature_and_we_accept_its() -> None:
    reference = standardwebhooks.Webhook(SECRET_TEXT)
    now = int(time.time())
    assert reference.verify(BODY, _signed(stamp=now)) == json.loads(BODY)

    theirs = reference.sign("msg_ref", datetime.fromtimestamp(now, tz=UTC), BODY.decode())
    headers = {"webhook-id": "msg_ref", "webhook-timestamp": str(now), "webhook-signature": theirs}
    verify(Secret.parse(SECRET_TEXT), headers, BODY, now=now)


@pytest.mark.parametrize(
    "text",
    [
        SECRET_TEXT,
        SECRET_TEXT.removeprefix("whsec_"),
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        # Unpadded base64, as some providers print it.
        "whsec_" + base64.b64encode(b"twenty-five bytes of key!").decode().rstrip("="),
        SECRET_TEXT + "\n",
    ],
)
def test_secret_texts_mean_the_same_key_as_in_the_reference_library(text: str) -> None:
    now = int(time.time())
    headers = sign(Secret.parse(text), "msg_1", now, BODY)
    standardwebhooks.Webhook(text.strip()).verify(BODY, headers)


def test_a_tampered_body_fails() -> None:
    headers = _signed()
    with pytest.raises(SignatureInvalid, match="no webhook-signature entry matches") as raised:
        verify(SECRET, headers, BODY.replace(b"0.42", b"0.43"), now=STAMP)
    assert "1 v1 signature checked" in str(raised.value)


@pytest.mark.parametrize(
    ("header", "value"), [("webhook-id", "msg_other"), ("webhook-timestamp", str(STAMP + 1))]
)
def test_the_id_and_timestamp_are_signed_too(header: str, value: str) -> None:
    headers = {**_signed(), header: value}
    with pytest.raises(SignatureInvalid, match="no webhook-signature entry matches"):
        verify(SECRET, headers, BODY, now=STAMP)


def test_a_wrong_secret_fails() -> None:
    with pytest.raises(SignatureInvalid, match="no webhook-signature entry matches"):
        verify(Secret(b"another key entirely, 32 bytes!!"), _signed(), BODY, now=STAMP)


def test_a_stale_timestamp_fails() -> None:
    headers = _signed()
    verify(SECRET, headers, BODY, now=STAMP + 300)
    with pytest.raises(SignatureInvalid) as raised:
        verify(SECRET, headers, BODY, now=STAMP + 301)
    assert str(raised.value) == "webhook-timestamp 1700000000 is too old: 301s ago, beyond the 300s tolerance"


def test_a_future_timestamp_fails() -> None:
    headers = _signed()
    verify(SECRET, headers, BODY, now=STAMP - 300)
    with pytest.raises(SignatureInvalid) as raised:
        verify(SECRET, headers, BODY, now=STAMP - 301)
    assert str(raised.value) == (
        "webhook-timestamp 1700000000 is too new: 301s in the future, beyond the 300s tolerance"
    )


def test_the_tolerance_can_be_narrowed() -> None:
    with pytest.raises(SignatureInvalid, match="too old: 31s ago, beyond the 30s tolerance"):
        verify(SECRET, _signed(), BODY, now=STAMP + 31, tolerance_s=30)


def test_verify_uses_the_clock_when_now_is_not_given() -> None:
    verify(SECRET, _signed(stamp=int(time.time())), BODY)
    with pytest.raises(SignatureInvalid, match="too old"):
        verify(SECRET, _signed(stamp=int(time.time()) - 3600), BODY)


def test_one_matching_signature_among_several_is_enough() -> None:
    good = _signed()
    wrong = sign(Secret(b"the old key, before rotation...."), "msg_2b7Xq", STAMP, BODY)["webhook-signature"]
    for listed in (
        f"{wrong} {good['webhook-signature']}",
        f"v1a,c29tZSBlZDI1NTE5IHNpZ25hdHVyZQ== {good['webhook-signature']}",
        f"v1,not*base64 {good['webhook-signature']}",
    ):
        verify(SECRET, {**good, "webhook-signature": listed}, BODY, now=STAMP)


def test_no_matching_signature_among_several_says_what_was_checked() -> None:
    wrong = sign(Secret(b"the old key, before rotation...."), "msg_2b7Xq", STAMP, BODY)["webhook-signature"]
    headers = {**_signed(), "webhook-signature": f"{wrong} {wrong} v1,not*base64 v2,whatever"}
    with pytest.raises(SignatureInvalid) as raised:
        verify(SECRET, headers, BODY, now=STAMP)
    assert str(raised.value) == (
        "no webhook-signature entry matches the body signed with this secret "
        "(2 v1 signatures checked, 1 not base64)"
    )


def test_header_names_are_case_insensitive() -> None:
    headers = {name.title(): value for name, value in _signed().items()}
    assert "Webhook-Signature" in headers
    verify(SECRET, headers, BODY, now=STAMP)


@pytest.mark.parametrize(
    ("dropped", "message"),
    [
        (("webhook-id",), "missing header: webhook-id"),
        (("webhook-timestamp",), "missing header: webhook-timestamp"),
        (("webhook-signature",), "missing header: webhook-signature"),
        (("webhook-id", "webhook-signature"), "missing headers: webhook-id, webhook-signature"),
    ],
)
def test_a_missing_header_is_named(dropped: tuple[str, ...], message: str) -> None:
    headers = {name: value for name, value in _signed().items() if name not in dropped}
    with pytest.raises(SignatureInvalid) as raised:
        verify(SECRET, headers, BODY, now=STAMP)
    assert str(raised.value) == message


def test_an_empty_header_counts_as_missing() -> None:
    with pytest.raises(SignatureInvalid, match="missing header: webhook-id"):
        verify(SECRET, {**_signed(), "webhook-id": ""}, BODY, now=STAMP)


@pytest.mark.parametrize("stamp", ["1700000000.5", "-1700000000", "soon", "١٧٠٠٠٠٠٠٠٠", "1e9", " 1700000000"])
def test_a_timestamp_that_is_not_integer_seconds_fails(stamp: str) -> None:
    with pytest.raises(SignatureInvalid) as raised:
        verify(SECRET, {**_signed(), "webhook-timestamp": stamp}, BODY, now=STAMP)
    assert str(raised.value) == f"webhook-timestamp is not an integer number of seconds: {stamp!r}"


@pytest.mark.parametrize("msg_id", ["", "has space", "new\nline", "ünïcode"])
def test_sign_refuses_an_id_that_cannot_be_a_header(msg_id: str) -> None:
    with pytest.raises(ValueError, match="a webhook id is visible ASCII without spaces"):
        sign(SECRET, msg_id, STAMP, BODY)


@pytest.mark.parametrize("stamp", [-1, True, 1.5])
def test_sign_refuses_a_timestamp_that_is_not_integer_seconds(stamp: int) -> None:
    with pytest.raises(ValueError, match="a webhook timestamp is a non-negative integer of seconds"):
        sign(SECRET, "msg_1", stamp, BODY)


# --- the secret never shows ---


def _leaks(text: str) -> list[str]:
    forms = [SECRET_TEXT, SECRET_TEXT.removeprefix("whsec_"), KEY.hex(), repr(KEY), str(list(KEY))]
    return [form for form in forms if form in text]


def test_a_secret_prints_as_a_mask() -> None:
    secret = Secret.parse(SECRET_TEXT)
    shown = [repr(secret), str(secret), f"{secret}", f"{secret!r}", "%s" % secret, "{}".format(secret)]  # noqa: UP031, UP032
    shown += [repr({"secret": secret}), repr([secret]), str((secret,))]
    assert all(text.count("Secret('**********')") >= 1 for text in shown), shown
    assert _leaks("\n".join(shown)) == []


def test_logging_a_secret_shows_the_mask(caplog: pytest.LogCaptureFixture) -> None:
    secret = Secret.parse(SECRET_TEXT)
    with caplog.at_level(logging.INFO):
        logging.getLogger("evald.test").info("webhook secret %s, config %r", secret, {"secret": secret})
    event = {"event": "webhook.configured", "secret": secret, "nested": {"secrets": [secret]}}
    lines = [
        structlog.processors.JSONRenderer()(None, "info", dict(event)),
        structlog.dev.ConsoleRenderer(colors=False)(None, "info", dict(event)),
    ]
    rendered = [caplog.text, *(line if isinstance(line, str) else line.decode() for line in lines)]
    assert all("Secret('**********')" in text for text in rendered), rendered
    assert _leaks("\n".join(rendered)) == []


def test_a_secret_cannot_be_pickled_and_copies_are_itself() -> None:
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(SECRET)
    assert copy.copy(SECRET) is SECRET
    assert copy.deepcopy({"s": SECRET})["s"] is SECRET


def test_secrets_compare_by_key() -> None:
    assert Secret.parse(SECRET_TEXT) == SECRET
    assert hash(Secret.parse(SECRET_TEXT)) == hash(SECRET)
    assert Secret.parse(SECRET_TEXT) != Secret(b"x" * 32)


def test_a_generated_secret_round_trips_through_its_text() -> None:
    secret = Secret.generate()
    assert len(secret.reveal()) == 32
    assert secret.reveal_text().startswith("whsec_")
    assert Secret.parse(secret.reveal_text()) == secret
    assert Secret.generate() != secret
    with pytest.raises(ValueError, match="a webhook secret is 24 to 64 bytes, not 16"):
        Secret.generate(16)


@pytest.mark.parametrize("text", ["hunter2-is-my-passphrase!", "whsec_abc$def", "whsec_abcde", "whsec_"])
def test_a_secret_that_is_not_base64_is_refused_without_showing_it(text: str) -> None:
    with pytest.raises(SecretError) as raised:
        Secret.parse(text)
    message = str(raised.value)
    assert message.startswith("the webhook secret is")
    secret_part = text.removeprefix("whsec_")
    assert not secret_part or secret_part not in message


def test_an_empty_key_is_refused() -> None:
    with pytest.raises(SecretError, match="the webhook secret is empty"):
        Secret(b"")


# --- load_secret ---


def _secret_file(tmp_path: Path, content: str, mode: int = 0o600) -> Path:
    path = tmp_path / "webhook.secret"
    path.write_text(content)
    path.chmod(mode)
    return path


def test_the_secret_loads_from_an_environment_variable() -> None:
    secret = load_secret(env="EVALD_WEBHOOK_SECRET", file=None, environ={"EVALD_WEBHOOK_SECRET": SECRET_TEXT})
    assert secret == SECRET


def test_the_secret_loads_from_a_private_file(tmp_path: Path) -> None:
    path = _secret_file(tmp_path, SECRET_TEXT + "\n")
    assert load_secret(env=None, file=path, environ={}) == SECRET


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({}, "environment variable HOOK_KEY, which should hold the webhook secret, is not set"),
        ({"HOOK_KEY": ""}, "environment variable HOOK_KEY, which should hold the webhook secret, is empty"),
        (
            {"HOOK_KEY": " \n"},
            "environment variable HOOK_KEY, which should hold the webhook secret, is empty",
        ),
    ],
)
def test_an_unset_or_empty_environment_variable_is_named(environ: dict[str, str], message: str) -> None:
    with pytest.raises(SecretError) as raised:
        load_secret(env="HOOK_KEY", file=None, environ=environ)
    assert str(raised.value) == message


def test_a_bad_secret_in_the_environment_names_the_variable_not_the_value() -> None:
    with pytest.raises(SecretError) as raised:
        load_secret(env="HOOK_KEY", file=None, environ={"HOOK_KEY": "my passphrase!"})
    assert str(raised.value).startswith("environment variable HOOK_KEY: the webhook secret is not base64")
    assert "passphrase!" not in str(raised.value)


def test_both_or_neither_source_is_refused(tmp_path: Path) -> None:
    path = _secret_file(tmp_path, SECRET_TEXT)
    with pytest.raises(SecretError) as raised:
        load_secret(env="HOOK_KEY", file=path, environ={"HOOK_KEY": SECRET_TEXT})
    assert str(raised.value) == (
        f"the webhook secret is given both as environment variable HOOK_KEY and as file {path}; give one"
    )
    with pytest.raises(SecretError) as raised:
        load_secret(env=None, file=None, environ={"HOOK_KEY": SECRET_TEXT})
    assert (
        str(raised.value) == "no webhook secret given: name an environment variable or a file that holds it"
    )


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o620, 0o610])
def test_a_secret_file_open_to_group_or_others_is_refused(tmp_path: Path, mode: int) -> None:
    path = _secret_file(tmp_path, SECRET_TEXT, mode)
    with pytest.raises(SecretError) as raised:
        load_secret(env=None, file=path, environ={})
    assert str(raised.value) == (
        f"webhook secret file {path} is accessible by group or others (mode {mode:04o}); "
        f"make it private with: chmod 600 {path}"
    )


def test_a_read_only_secret_file_is_fine(tmp_path: Path) -> None:
    assert load_secret(env=None, file=_secret_file(tmp_path, SECRET_TEXT, 0o400), environ={}) == SECRET


def test_a_symlink_to_a_private_file_is_followed(tmp_path: Path) -> None:
    # Kubernetes and systemd credentials both hand secrets over through symlinks.
    link = tmp_path / "link"
    link.symlink_to(_secret_file(tmp_path, SECRET_TEXT))
    assert load_secret(env=None, file=link, environ={}) == SECRET


def test_secret_file_problems_are_named(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo", 0o600)
    cases = {
        # Refused without blocking: opening a FIFO for reading would wait for a writer.
        tmp_path / "fifo": f"webhook secret file {tmp_path / 'fifo'} is not a regular file",
        tmp_path / "absent": f"webhook secret file {tmp_path / 'absent'} does not exist",
        tmp_path: f"webhook secret file {tmp_path} is not a regular file",
        _secret_file(tmp_path, "") / "below": (
            f"webhook secret file {tmp_path / 'webhook.secret' / 'below'} cannot be opened: Not a directory"
        ),
    }
    for path, message in cases.items():
        with pytest.raises(SecretError) as raised:
            load_secret(env=None, file=path, environ={})
        assert str(raised.value) == message


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("", "is empty"),
        ("\n\n", "is empty"),
        ("x" * 5000, "is larger than 4096 bytes; it should hold the secret alone, on one line"),
        ("my passphrase!", ": the webhook secret is not base64"),
    ],
)
def test_a_secret_file_with_bad_content_is_refused(tmp_path: Path, content: str, problem: str) -> None:
    path = _secret_file(tmp_path, content)
    with pytest.raises(SecretError) as raised:
        load_secret(env=None, file=path, environ={})
    assert str(raised.value).startswith(
        f"webhook secret file {path}{'' if problem[0] == ':' else ' '}{problem}"
    )


def test_a_secret_file_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "binary"
    path.write_bytes(b"\xff\xfe" + KEY)
    path.chmod(0o600)
    with pytest.raises(SecretError, match="is not UTF-8 text"):
        load_secret(env=None, file=path, environ={})


# --- the loopback receiver ---


def _post(
    receiver: WebhookReceiver, body: bytes, headers: dict[str, str], timeout: float = 5.0
) -> httpx.Response:
    return httpx.post(
        receiver.url, content=body, headers={**headers, "content-type": "application/json"}, timeout=timeout
    )


def test_the_receiver_verifies_and_records_deliveries_in_order() -> None:
    with WebhookReceiver(SECRET) as receiver:
        assert receiver.url.startswith("http://127.0.0.1:")
        for n in range(3):
            body = json.dumps({"n": n}).encode()
            response = _post(receiver, body, sign(SECRET, f"msg_{n}", int(time.time()), body))
            assert response.status_code == 200
        deliveries = receiver.wait_for(3, timeout=5)
    assert [json.loads(d.body) for d in deliveries] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert [d.webhook_id for d in deliveries] == ["msg_0", "msg_1", "msg_2"]
    assert all(d.error is None and d.headers["content-type"] == "application/json" for d in deliveries)


def test_the_receiver_refuses_bad_signatures_with_401() -> None:
    now = int(time.time())
    with WebhookReceiver(SECRET) as receiver:
        tampered = _post(receiver, BODY + b" ", sign(SECRET, "msg_t", now, BODY))
        stale = _post(receiver, BODY, sign(SECRET, "msg_s", now - 600, BODY))
        wrong = _post(receiver, BODY, sign(Secret(b"y" * 32), "msg_w", now, BODY))
        unsigned = _post(receiver, BODY, {})
        attempts = receiver.attempts
        assert receiver.deliveries == []
    assert [r.status_code for r in (tampered, stale, wrong, unsigned)] == [401] * 4
    errors = [a.error or "" for a in attempts]
    assert errors[0].startswith("no webhook-signature entry matches")
    assert errors[1].startswith("webhook-timestamp") and "too old" in errors[1]
    assert errors[2].startswith("no webhook-signature entry matches")
    assert errors[3] == "missing headers: webhook-id, webhook-timestamp, webhook-signature"


def test_the_receiver_checks_time_with_its_own_clock() -> None:
    with WebhookReceiver(SECRET, clock=lambda: STAMP + 1000) as receiver:
        assert _post(receiver, BODY, _signed()).status_code == 401
        assert _post(receiver, BODY, _signed(stamp=STAMP + 999)).status_code == 200


def test_the_receiver_acknowledges_a_duplicate_but_delivers_it_once() -> None:
    headers = sign(SECRET, "msg_dup", int(time.time()), BODY)
    with WebhookReceiver(SECRET) as receiver:
        assert [_post(receiver, BODY, headers).status_code for _ in range(3)] == [200, 200, 200]
        assert [a.duplicate for a in receiver.attempts] == [False, True, True]
        assert [d.webhook_id for d in receiver.deliveries] == ["msg_dup"]


def test_the_receiver_answers_as_scripted_and_delivers_only_on_2xx() -> None:
    headers = sign(SECRET, "msg_retry", int(time.time()), BODY)
    with WebhookReceiver(SECRET) as receiver:
        receiver.respond(503, retry_after="7")
        receiver.respond(500, times=2)
        receiver.respond(410)
        responses = [_post(receiver, BODY, headers) for _ in range(5)]
        assert [r.status_code for r in responses] == [503, 500, 500, 410, 200]
        assert responses[0].headers["retry-after"] == "7"
        assert "retry-after" not in responses[1].headers
        assert [a.duplicate for a in receiver.attempts] == [False] * 5
        [delivery] = receiver.deliveries
        assert delivery is receiver.attempts[-1]


def test_a_bad_signature_does_not_use_up_the_script() -> None:
    with WebhookReceiver(SECRET) as receiver:
        receiver.respond(500)
        assert _post(receiver, BODY, {**_signed(), "webhook-signature": "v1,AAAA"}).status_code == 401
        assert _post(receiver, BODY, sign(SECRET, "m", int(time.time()), BODY)).status_code == 500


def test_a_hanging_receiver_times_the_sender_out_and_its_retry_is_a_duplicate() -> None:
    headers = sign(SECRET, "msg_slow", int(time.time()), BODY)
    with WebhookReceiver(SECRET) as receiver:
        receiver.hang(1.5)
        bound = Deadline(1.4)
        with pytest.raises(httpx.ReadTimeout):
            _post(receiver, BODY, headers, timeout=0.3)
        # Before the receiver lets go (in seconds of a quiet machine: tests/deadlines.py).
        assert not bound.expired(), f"took {bound.waited():.1f} s"
        # The retry arrives while the first request is still held; the first one completes afterwards.
        assert _post(receiver, BODY, headers).status_code == 200
        [delivery] = receiver.wait_for(1, timeout=5)
        assert delivery.webhook_id == "msg_slow"
        assert [a.duplicate for a in receiver.attempts] == [True, False]


def test_wait_for_says_what_arrived_when_it_times_out() -> None:
    with WebhookReceiver(SECRET) as receiver:
        _post(receiver, BODY, sign(SECRET, "m1", int(time.time()), BODY))
        with pytest.raises(TimeoutError) as raised:
            receiver.wait_for(2, timeout=0.2)
    assert str(raised.value) == "the webhook receiver got 1 of 2 deliveries in 0.2s (1 requests)"


def test_closing_the_receiver_releases_a_hanging_request() -> None:
    receiver = WebhookReceiver(SECRET).start()
    receiver.hang(60)
    bound = Deadline(5)
    with pytest.raises(httpx.TimeoutException):
        _post(receiver, BODY, sign(SECRET, "m", int(time.time()), BODY), timeout=0.2)
    receiver.close()
    # In seconds of a quiet machine (tests/deadlines.py): a loaded one stretches the bound.
    assert not bound.expired(), f"took {bound.waited():.1f} s"
    assert [a.webhook_id for a in receiver.wait_for(1, timeout=5)] == ["m"]
