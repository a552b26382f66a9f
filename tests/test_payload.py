from __future__ import annotations

import dataclasses
import json
import math
import re
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from daemon.delivery.payload import (
    FORMATS,
    SLACK_HEADER_LIMIT,
    SLACK_TEXT_LIMIT,
    AlertMessage,
    Format,
    render,
)

STARTS = datetime(2025, 3, 14, 9, 26, 53, tzinfo=UTC)
ENDS = datetime(2025, 3, 14, 11, 0, 0, 250000, tzinfo=UTC)
LINKS = {"dashboard": "https://evald.example/runs/grpo-7", "runbook": "https://wiki.example/evald#drop"}


def _message(**changes: Any) -> AlertMessage:
    fields: dict[str, Any] = {
        "id": "msg_01HZX3",
        "fingerprint": "9f2c4e1a7b3d5c60",
        "run": "grpo-7",
        "checkpoint": "global_step1200",
        "step": 1200,
        "first_step": 1200,
        "last_step": 1200,
        "task": "gsm8k",
        "metric": "accuracy",
        "rule": "drop_from_best",
        "value": 0.412,
        "baseline": 0.537,
        "best_step": 900,
        "rollback_step": 1100,
        "severity": "critical",
        "state": "firing",
        "message": "accuracy fell 0.125 below its best (step 900)",
        "links": LINKS,
        "starts_at": STARTS,
        "ends_at": None,
    }
    fields.update(changes)
    return AlertMessage(**fields)


def _resolved(**changes: Any) -> AlertMessage:
    return _message(state="resolved", ends_at=ENDS, **changes)


def _strict_json(body: bytes) -> Any:
    def refuse(constant: str) -> Any:
        raise AssertionError(f"{constant} is not JSON")

    return json.loads(body.decode("utf-8"), parse_constant=refuse)


def _utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_renders_compact_deterministic_json(fmt: Format) -> None:
    for message in (_message(), _resolved(), _message(value=math.nan, baseline=-math.inf)):
        body = render(fmt, message)
        assert body == render(fmt, dataclasses.replace(message))
        canonical = json.dumps(_strict_json(body), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        assert body == canonical.encode("utf-8")


def test_an_unknown_format_lists_the_known_ones() -> None:
    with pytest.raises(ValueError) as raised:
        render("teams", _message())  # type: ignore[arg-type]
    assert str(raised.value) == "unknown alert format 'teams'; known formats: generic, slack, alertmanager"


# --- generic ---


def test_generic_carries_every_field() -> None:
    document = _strict_json(render("generic", _message()))
    assert document == {
        "type": "evald.alert",
        "version": 1,
        "id": "msg_01HZX3",
        "fingerprint": "9f2c4e1a7b3d5c60",
        "run": "grpo-7",
        "checkpoint": "global_step1200",
        "step": 1200,
        "first_step": 1200,
        "last_step": 1200,
        "task": "gsm8k",
        "metric": "accuracy",
        "rule": "drop_from_best",
        "value": 0.412,
        "baseline": 0.537,
        "nonfinite": {},
        "best_step": 900,
        "rollback_step": 1100,
        "severity": "critical",
        "state": "firing",
        "event": "fired",
        "message": "accuracy fell 0.125 below its best (step 900)",
        "links": LINKS,
        "starts_at": "2025-03-14T09:26:53Z",
        "ends_at": None,
        "resolved_step": None,
    }


def test_an_alert_seen_again_shows_its_onset_and_its_latest_step_in_every_format() -> None:
    """The onset (step 840, where the collapse began) is the step shown; the checkpoint named is the
    latest finding's (step 960), said as such, never as if it were the onset."""
    message = _message(step=840, first_step=840, last_step=960, checkpoint="global_step960")
    generic = _strict_json(render("generic", message))
    assert (generic["step"], generic["first_step"], generic["last_step"], generic["resolved_step"]) == (
        840,
        840,
        960,
        None,
    )
    slack = _strict_json(render("slack", message))
    assert slack["text"].startswith(
        "🔴 critical drop_from_best firing: grpo-7 gsm8k/accuracy at step 840 (still at step 960) — "
    )
    facts = slack["blocks"][1]["text"]["text"].split("\n")
    assert "*Checkpoint:* global_step960 (step 960)" in facts
    assert "*Onset:* step 840" in facts
    annotations = _strict_json(render("alertmanager", message))["alerts"][0]["annotations"]
    assert (annotations["step"], annotations["first_step"], annotations["last_step"]) == ("840", "840", "960")
    assert annotations["summary"].endswith("at step 840 (still at step 960)")


def test_an_update_says_so_with_its_new_steps_in_every_format() -> None:
    """A late older result moved the onset back to 840: one ``updated`` notice carries it. A message
    stored before evald said why (no ``event``) reads as fired or resolved by its state; an unknown one
    is refused."""
    message = _message(step=840, first_step=840, last_step=960, event="updated")
    generic = _strict_json(render("generic", message))
    assert (generic["event"], generic["state"], generic["first_step"]) == ("updated", "firing", 840)
    slack = _strict_json(render("slack", message))
    assert slack["text"].startswith(
        "🔴 critical drop_from_best firing (updated): grpo-7 gsm8k/accuracy at step 840"
    )
    assert slack["blocks"][0]["text"]["text"].startswith("🔴 FIRING (UPDATED) · critical: drop_from_best")
    annotations = _strict_json(render("alertmanager", message))["alerts"][0]["annotations"]
    assert (annotations["event"], annotations["first_step"]) == ("updated", "840")
    assert "firing (updated): " in annotations["summary"]
    resolved = _resolved(resolved_step=1080, event="updated")
    assert _strict_json(render("generic", resolved))["event"] == "updated"
    assert _strict_json(render("generic", _resolved()))["event"] == "resolved"
    assert _strict_json(render("slack", _resolved()))["text"].startswith(
        "✅ critical drop_from_best resolved: "
    )
    with pytest.raises(ValueError, match="event 'moved' is not one of fired, updated, reminder"):
        _message(event="moved")


def test_a_resolved_alert_names_its_onset_its_last_step_and_the_step_that_resolved_it() -> None:
    message = _resolved(
        step=1080, first_step=840, last_step=960, resolved_step=1080, checkpoint="global_step960"
    )
    slack = _strict_json(render("slack", message))
    facts = slack["blocks"][1]["text"]["text"].split("\n")
    assert "*Checkpoint:* global_step960 (step 960)" in facts
    assert "*Onset:* step 840" in facts
    assert "*Resolved at:* step 1080" in facts
    assert "still at" not in slack["text"]
    generic = _strict_json(render("generic", message))
    assert (generic["first_step"], generic["last_step"], generic["resolved_step"]) == (840, 960, 1080)


def test_a_message_stored_before_onsets_were_kept_still_renders() -> None:
    message = _message(first_step=None, last_step=None)
    generic = _strict_json(render("generic", message))
    assert (generic["step"], generic["first_step"], generic["last_step"]) == (1200, None, None)
    facts = _strict_json(render("slack", message))["blocks"][1]["text"]["text"]
    assert "*Checkpoint:* global_step1200 (step 1200)" in facts and "Onset" not in facts


def test_generic_resolved_has_its_end_in_utc() -> None:
    berlin = timezone(timedelta(hours=1))
    message = _resolved(starts_at=STARTS.astimezone(berlin))
    document = _strict_json(render("generic", message))
    assert (document["state"], document["starts_at"], document["ends_at"]) == (
        "resolved",
        "2025-03-14T09:26:53Z",
        "2025-03-14T11:00:00.250000Z",
    )


def test_generic_keeps_absent_fields_as_null() -> None:
    message = _message(checkpoint=None, step=None, task=None, metric=None, value=None, baseline=None)
    document = _strict_json(render("generic", message))
    assert [document[k] for k in ("checkpoint", "step", "task", "metric", "value", "baseline")] == [None] * 6
    assert document["nonfinite"] == {}


@pytest.mark.parametrize(
    ("value", "baseline", "nonfinite"),
    [
        (math.nan, 0.5, {"value": "NaN"}),
        (math.inf, -math.inf, {"value": "Infinity", "baseline": "-Infinity"}),
        (0.25, math.nan, {"baseline": "NaN"}),
    ],
)
def test_generic_writes_a_nonfinite_number_as_null_and_names_it(
    value: float, baseline: float, nonfinite: dict[str, str]
) -> None:
    document = _strict_json(render("generic", _message(value=value, baseline=baseline)))
    assert document["nonfinite"] == nonfinite
    for name in ("value", "baseline"):
        assert document[name] == (None if name in nonfinite else {"value": value, "baseline": baseline}[name])


def test_generic_text_is_utf8_not_escaped() -> None:
    body = render("generic", _message(message="précision ↓ 12 % — 精度"))
    assert "précision ↓ 12 % — 精度".encode() in body


# --- slack ---


def _texts(document: dict[str, Any]) -> list[tuple[str, str]]:
    """(block type, text) for every text Slack limits."""
    found = []
    for block in document["blocks"]:
        if "text" in block:
            found.append((block["type"], block["text"]["text"]))
        for element in block.get("elements", []):
            found.append((block["type"], element["text"]))
    return found


def test_slack_has_a_fallback_line_and_the_key_facts() -> None:
    document = _strict_json(render("slack", _message()))
    assert document["text"] == (
        "🔴 critical drop_from_best firing: grpo-7 gsm8k/accuracy at step 1200 — "
        "accuracy fell 0.125 below its best (step 900)"
    )
    header, facts, message, context = document["blocks"]
    assert header == {
        "type": "header",
        "text": {"type": "plain_text", "text": "🔴 FIRING · critical: drop_from_best on grpo-7"},
    }
    assert facts["type"] == "section" and facts["text"]["type"] == "mrkdwn"
    assert facts["text"]["text"].split("\n") == [
        "*Run:* grpo-7",
        "*Checkpoint:* global_step1200 (step 1200)",
        "*Task:* gsm8k",
        "*Metric:* accuracy",
        "*Value:* 0.412 (baseline 0.537)",
        "*Best step:* 900",
        "*Last good step:* 1100",
        "*Links:* <https://evald.example/runs/grpo-7|dashboard> · <https://wiki.example/evald#drop|runbook>",
    ]
    assert message["text"] == {"type": "mrkdwn", "text": "accuracy fell 0.125 below its best (step 900)"}
    assert context["type"] == "context"
    assert context["elements"] == [
        {
            "type": "mrkdwn",
            "text": "fingerprint `9f2c4e1a7b3d5c60` · id `msg_01HZX3` · since 2025-03-14T09:26:53Z",
        }
    ]


def test_slack_resolved_says_so() -> None:
    document = _strict_json(render("slack", _resolved()))
    assert document["text"].startswith("✅ critical drop_from_best resolved: grpo-7")
    assert document["blocks"][0]["text"]["text"] == "✅ RESOLVED · critical: drop_from_best on grpo-7"
    assert document["blocks"][-1]["elements"][0]["text"].endswith("· resolved 2025-03-14T11:00:00.250000Z")


def test_slack_shows_nonfinite_values_as_words() -> None:
    document = _strict_json(render("slack", _message(value=math.nan, baseline=math.inf)))
    assert "*Value:* NaN (baseline Infinity)" in document["blocks"][1]["text"]["text"]


def test_slack_escapes_its_control_characters() -> None:
    message = _message(run="a<b>&c", message="<!channel> x & y <https://evil|click>")
    document = _strict_json(render("slack", message))
    body = json.dumps(document, ensure_ascii=False)
    assert "<!channel>" not in body and "<https://evil" not in body
    assert document["blocks"][2]["text"]["text"] == "&lt;!channel&gt; x &amp; y &lt;https://evil|click&gt;"
    assert "*Run:* a&lt;b&gt;&amp;c" in document["blocks"][1]["text"]["text"]
    # The header is plain text: shown as written, nothing to escape.
    assert document["blocks"][0]["text"]["text"].endswith("on a<b>&c")


def test_slack_keeps_within_its_limits_with_a_huge_message() -> None:
    # Astral emoji count two UTF-16 units each in Slack's limits; & becomes a 5-character entity.
    huge = ("regression 🚨 & <lost> " * 400) + "\n" + "tail"
    long_run = "run-" + "x" * 300
    document = _strict_json(render("slack", _message(message=huge, run=long_run, fingerprint="f" * 4000)))
    texts = _texts(document)
    for kind, text in texts:
        limit = SLACK_HEADER_LIMIT if kind == "header" else SLACK_TEXT_LIMIT
        assert _utf16_len(text) <= limit, (kind, _utf16_len(text))
    assert [kind for kind, text in texts if text.endswith("…")] == ["header", "section", "context"]
    cut_message = texts[2][1]
    assert _utf16_len(cut_message) >= SLACK_TEXT_LIMIT - 10
    # Cut at an entity boundary: every & starts a whole entity.
    assert re.search(r"&(?!amp;|lt;|gt;)", cut_message) is None
    assert "\n" not in document["text"] and _utf16_len(document["text"]) <= SLACK_TEXT_LIMIT


def test_slack_leaves_out_what_is_absent() -> None:
    message = _message(
        checkpoint=None, task=None, metric=None, value=None, baseline=None, best_step=None, rollback_step=None
    )
    document = _strict_json(render("slack", dataclasses.replace(message, message="", links={})))
    assert [block["type"] for block in document["blocks"]] == ["header", "section", "context"]
    assert document["blocks"][1]["text"]["text"] == "*Run:* grpo-7\n*Checkpoint:* step 1200"
    assert document["text"] == "🔴 critical drop_from_best firing: grpo-7 at step 1200"


# --- alertmanager ---


def test_alertmanager_firing_is_a_version_4_payload() -> None:
    document = _strict_json(render("alertmanager", _message()))
    labels = {
        "alertname": "drop_from_best",
        "run": "grpo-7",
        "task": "gsm8k",
        "metric": "accuracy",
        "severity": "critical",
    }
    annotations = {
        "summary": "critical drop_from_best firing: grpo-7 gsm8k/accuracy at step 1200",
        "event": "fired",
        "description": "accuracy fell 0.125 below its best (step 900)",
        "value": "0.412",
        "baseline": "0.537",
        "step": "1200",
        "first_step": "1200",
        "last_step": "1200",
        "best_step": "900",
        "rollback_step": "1100",
        "checkpoint": "global_step1200",
        "dashboard_url": LINKS["dashboard"],
        "runbook_url": LINKS["runbook"],
    }
    assert document == {
        "version": "4",
        "groupKey": (
            '{}:{alertname="drop_from_best", metric="accuracy", run="grpo-7", '
            'severity="critical", task="gsm8k"}'
        ),
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": "evald",
        "groupLabels": labels,
        "commonLabels": labels,
        "commonAnnotations": annotations,
        "externalURL": "",
        "alerts": [
            {
                "status": "firing",
                "labels": labels,
                "annotations": annotations,
                "startsAt": "2025-03-14T09:26:53Z",
                "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": LINKS["dashboard"],
                "fingerprint": "9f2c4e1a7b3d5c60",
            }
        ],
    }


def test_alertmanager_fields_have_the_types_receivers_expect() -> None:
    for message in (_message(), _resolved(value=math.nan, task=None, links={})):
        document = _strict_json(render("alertmanager", message))
        for name in ("version", "groupKey", "status", "receiver", "externalURL"):
            assert isinstance(document[name], str), name
        assert isinstance(document["truncatedAlerts"], int)
        for name in ("groupLabels", "commonLabels", "commonAnnotations"):
            assert all(isinstance(v, str) for v in document[name].values()), name
        [alert] = document["alerts"]
        assert set(alert) == {
            "status",
            "labels",
            "annotations",
            "startsAt",
            "endsAt",
            "generatorURL",
            "fingerprint",
        }
        assert all(isinstance(alert[k], str) for k in ("status", "startsAt", "endsAt", "generatorURL"))
        assert all(isinstance(v, str) for v in (*alert["labels"].values(), *alert["annotations"].values()))
        for moment in (alert["startsAt"], alert["endsAt"]):
            assert datetime.fromisoformat(moment).utcoffset() == timedelta(0)


def test_alertmanager_resolved_ends_and_keeps_the_group() -> None:
    firing = _strict_json(render("alertmanager", _message()))
    resolved = _strict_json(render("alertmanager", _resolved()))
    assert (resolved["status"], resolved["alerts"][0]["status"]) == ("resolved", "resolved")
    assert resolved["alerts"][0]["endsAt"] == "2025-03-14T11:00:00.250000Z"
    # The same alert: a receiver pairs the resolution with the firing by these.
    assert resolved["groupKey"] == firing["groupKey"]
    assert resolved["alerts"][0]["fingerprint"] == firing["alerts"][0]["fingerprint"]
    assert resolved["alerts"][0]["labels"] == firing["alerts"][0]["labels"]


def test_alertmanager_leaves_out_empty_labels_and_annotations() -> None:
    message = _message(
        task=None,
        metric=None,
        checkpoint=None,
        step=None,
        first_step=None,
        last_step=None,
        value=None,
        baseline=None,
        best_step=None,
    )
    document = _strict_json(
        render("alertmanager", dataclasses.replace(message, rollback_step=None, links={}))
    )
    [alert] = document["alerts"]
    assert alert["labels"] == {"alertname": "drop_from_best", "run": "grpo-7", "severity": "critical"}
    assert set(alert["annotations"]) == {"summary", "event", "description"}
    assert alert["generatorURL"] == ""
    assert document["groupKey"] == '{}:{alertname="drop_from_best", run="grpo-7", severity="critical"}'


def test_alertmanager_writes_nonfinite_values_as_words_and_exact_numbers_exactly() -> None:
    annotations = _strict_json(render("alertmanager", _message(value=math.nan, baseline=-math.inf)))[
        "commonAnnotations"
    ]
    assert (annotations["value"], annotations["baseline"]) == ("NaN", "-Infinity")
    annotations = _strict_json(render("alertmanager", _message(value=0.1 + 0.2, baseline=3)))[
        "commonAnnotations"
    ]
    assert (float(annotations["value"]), annotations["baseline"]) == (0.1 + 0.2, "3.0")


def test_alertmanager_group_key_quotes_label_values() -> None:
    document = _strict_json(render("alertmanager", _message(run='odd "run"\\', task=None, metric=None)))
    assert document["groupKey"] == (
        '{}:{alertname="drop_from_best", run="odd \\"run\\"\\\\", severity="critical"}'
    )


# --- the message itself ---


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"run": ""}, "an alert message needs a non-empty run"),
        ({"id": ""}, "an alert message needs a non-empty id"),
        ({"severity": "fatal"}, "severity 'fatal' is not one of info, warning, critical"),
        ({"state": "pending"}, "state 'pending' is not one of firing, resolved"),
        (
            {"starts_at": datetime(2025, 3, 14, 9, 0)},
            "starts_at 2025-03-14T09:00:00 has no time zone; give it one (UTC)",
        ),
        ({"state": "resolved"}, "a resolved alert message needs ends_at, the time it resolved"),
        ({"ends_at": ENDS}, "a firing alert message has no ends_at, got 2025-03-14T11:00:00.250000+00:00"),
        (
            {"state": "resolved", "ends_at": STARTS - timedelta(seconds=1)},
            "ends_at 2025-03-14T09:26:52+00:00 is before starts_at 2025-03-14T09:26:53+00:00",
        ),
        ({"links": {"dashboard": ""}}, "links map non-empty names to non-empty URLs, got 'dashboard': ''"),
    ],
)
def test_an_inconsistent_message_is_refused(changes: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValueError) as raised:
        _message(**changes)
    assert str(raised.value) == problem


def test_a_message_keeps_its_own_copy_of_the_links() -> None:
    links = dict(LINKS)
    message = _message(links=links)
    links["dashboard"] = "https://elsewhere.example"
    assert message.links["dashboard"] == LINKS["dashboard"]
    with pytest.raises(TypeError):
        message.links["new"] = "https://x.example"  # type: ignore[index]
    assert hash(message) == hash(_message())
    assert message == _message()
