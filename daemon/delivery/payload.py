"""Alert payloads: one :class:`AlertMessage` rendered as the body of a webhook request, in one of
:data:`FORMATS`.

- ``generic``: every field of the message as a JSON object, ``"type": "evald.alert"``, ``"version": 1``.
- ``slack``: an incoming-webhook message, ``text`` (the one-line fallback notifications show) and
  ``blocks``, cut to fit Slack's limits.
- ``alertmanager``: the body Alertmanager's ``webhook_config`` sends (``"version": "4"``), one alert per
  request, so receivers written for Alertmanager (incident tools, chat bridges) take evald's alerts as is.

Bodies are compact JSON with sorted keys, so the same message always renders to the same bytes (what is
signed is what a retry sends). A metric can be NaN or infinite, which JSON cannot hold: in ``generic``
such a ``value`` or ``baseline`` is ``null`` and the ``nonfinite`` object names it (``{"value": "NaN"}``),
so the number fields keep one type; text fields (Slack, Alertmanager annotations) write ``NaN``,
``Infinity`` or ``-Infinity``, spellings that Python, JavaScript and Go all parse.
"""

from __future__ import annotations

import json
import math
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, get_args

Severity = Literal["info", "warning", "critical"]
State = Literal["firing", "resolved"]
#: Why a notice is sent: the episode began (``fired``) or ended (``resolved``), a late older result moved
#: its steps (``updated``), it fires on after the cooldown (``reminder``) or its severity rose
#: (``escalated``). See :mod:`daemon.alerts.notices`.
Event = Literal["fired", "updated", "reminder", "escalated", "resolved"]
Format = Literal["generic", "slack", "alertmanager"]
FORMATS: tuple[Format, ...] = get_args(Format)

GENERIC_TYPE = "evald.alert"
GENERIC_VERSION = 1
ALERTMANAGER_VERSION = "4"
#: Alertmanager's receiver name in the payloads evald sends.
ALERTMANAGER_RECEIVER = "evald"
#: The link with this name, if any, becomes Alertmanager's ``generatorURL``.
GENERATOR_LINK = "dashboard"
#: Alertmanager writes this ``endsAt`` while an alert fires (Go's zero time).
ZERO_TIME = "0001-01-01T00:00:00Z"

# Slack rejects a message whose header text exceeds 150 characters or whose section or context text
# exceeds 3000 (counted in UTF-16 code units, as JavaScript counts).
SLACK_HEADER_LIMIT = 150
SLACK_TEXT_LIMIT = 3000

_SEVERITY_EMOJI: Mapping[Severity, str] = {"info": "🔵", "warning": "🟠", "critical": "🔴"}
_RESOLVED_EMOJI = "✅"


@dataclass(frozen=True, kw_only=True)
class AlertMessage:
    """One notification about one alert: its firing or its resolution."""

    #: Unique per notification; sent as ``webhook-id``, so a receiver can drop a retried duplicate.
    id: str
    #: Stable for the alert across its notifications (firing, then resolved).
    fingerprint: str
    run: str
    checkpoint: str | None
    step: int | None
    task: str | None
    metric: str | None
    rule: str
    value: float | None
    baseline: float | None
    best_step: int | None
    #: The last good step, to roll back to after a regression.
    rollback_step: int | None
    severity: Severity
    state: State
    message: str
    #: Name → URL (a dashboard, the checkpoint's report, a runbook).
    links: Mapping[str, str] = field(hash=False)
    starts_at: datetime
    #: When the alert resolved; ``None`` while it fires.
    ends_at: datetime | None
    #: The alert's onset, the latest step it fired at, and the step that resolved it (None: unknown, or a
    #: message stored before evald kept them). ``step`` is the onset while it fires, the resolving step
    #: once resolved.
    first_step: int | None = None
    last_step: int | None = None
    resolved_step: int | None = None
    #: Why it is sent (:data:`Event`); None (a message stored before evald said): ``fired`` while it fires,
    #: ``resolved`` after.
    event: Event | None = None

    def __post_init__(self) -> None:
        for name in ("id", "fingerprint", "run", "rule"):
            if not getattr(self, name):
                raise ValueError(f"an alert message needs a non-empty {name}")
        if self.severity not in get_args(Severity):
            raise ValueError(f"severity {self.severity!r} is not one of {', '.join(get_args(Severity))}")
        if self.state not in get_args(State):
            raise ValueError(f"state {self.state!r} is not one of {', '.join(get_args(State))}")
        if self.event is not None and self.event not in get_args(Event):
            raise ValueError(f"event {self.event!r} is not one of {', '.join(get_args(Event))}")
        for name in ("starts_at", "ends_at"):
            moment = getattr(self, name)
            if moment is not None and moment.utcoffset() is None:
                raise ValueError(f"{name} {moment.isoformat()} has no time zone; give it one (UTC)")
        if self.state == "resolved" and self.ends_at is None:
            raise ValueError("a resolved alert message needs ends_at, the time it resolved")
        if self.state == "firing" and self.ends_at is not None:
            raise ValueError(f"a firing alert message has no ends_at, got {self.ends_at.isoformat()}")
        if self.ends_at is not None and self.ends_at < self.starts_at:
            raise ValueError(
                f"ends_at {self.ends_at.isoformat()} is before starts_at {self.starts_at.isoformat()}"
            )
        for name, url in self.links.items():
            if not isinstance(name, str) or not isinstance(url, str) or not name or not url:
                raise ValueError(f"links map non-empty names to non-empty URLs, got {name!r}: {url!r}")
        # A private read-only copy: the caller's dict changing later must not change a frozen message.
        object.__setattr__(self, "links", types.MappingProxyType(dict(self.links)))

    @property
    def why(self) -> Event:
        """Why it is sent, said or (a message stored before evald said) read off its state."""
        return self.event or ("fired" if self.state == "firing" else "resolved")


def render(format: Format, message: AlertMessage) -> bytes:
    """The request body for ``message`` in ``format``."""
    renderer = _RENDERERS.get(format)
    if renderer is None:
        raise ValueError(f"unknown alert format {format!r}; known formats: {', '.join(FORMATS)}")
    return _dump(renderer(message))


def _dump(document: Mapping[str, Any]) -> bytes:
    # allow_nan=False: a non-finite number that slipped through is a bug here, not a body receivers choke on.
    return json.dumps(
        document, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def _timestamp(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _nonfinite_text(number: float) -> str:
    if math.isnan(number):
        return "NaN"
    return "Infinity" if number > 0 else "-Infinity"


def _json_number(number: float | None) -> float | None:
    return float(number) if number is not None and math.isfinite(number) else None


def _exact_text(number: float) -> str:
    return repr(float(number)) if math.isfinite(number) else _nonfinite_text(number)


def _short_text(number: float) -> str:
    return f"{number:.6g}" if math.isfinite(number) else _nonfinite_text(number)


def _summary(message: AlertMessage) -> str:
    """One line, e.g. ``critical drop_from_best firing: run-7 gsm8k/accuracy at step 1200``."""
    where = message.run
    if message.task or message.metric:
        where += " " + "/".join(part for part in (message.task, message.metric) if part)
    if message.step is not None:
        where += f" at step {message.step}"
    later = _last_seen(message)
    if later is not None:
        where += f" (still at step {later})"
    return f"{message.severity} {message.rule} {message.state}{_news(message)}: {where}"


def _news(message: AlertMessage) -> str:
    """`` (updated)``, `` (reminder)``, `` (escalated)``: a notice that is not the episode's start or end."""
    return "" if message.why in ("fired", "resolved") else f" ({message.why})"


def _last_seen(message: AlertMessage) -> int | None:
    """The latest step a firing alert fired at, when that is not its onset (the step shown)."""
    if message.state != "firing" or message.last_step is None or message.last_step == message.step:
        return None
    return message.last_step


def _generic(message: AlertMessage) -> dict[str, Any]:
    nonfinite = {
        name: _nonfinite_text(number)
        for name, number in (("value", message.value), ("baseline", message.baseline))
        if number is not None and not math.isfinite(number)
    }
    return {
        "type": GENERIC_TYPE,
        "version": GENERIC_VERSION,
        "id": message.id,
        "fingerprint": message.fingerprint,
        "run": message.run,
        "checkpoint": message.checkpoint,
        "step": message.step,
        "first_step": message.first_step,
        "last_step": message.last_step,
        "resolved_step": message.resolved_step,
        "task": message.task,
        "metric": message.metric,
        "rule": message.rule,
        "value": _json_number(message.value),
        "baseline": _json_number(message.baseline),
        "nonfinite": nonfinite,
        "best_step": message.best_step,
        "rollback_step": message.rollback_step,
        "severity": message.severity,
        "state": message.state,
        "event": message.why,
        "message": message.message,
        "links": dict(message.links),
        "starts_at": _timestamp(message.starts_at),
        "ends_at": None if message.ends_at is None else _timestamp(message.ends_at),
    }


def _utf16_units(char: str) -> int:
    return 2 if ord(char) > 0xFFFF else 1


def _fit(text: str, limit: int, *, escaped: bool = True) -> str:
    """``text`` cut to ``limit`` UTF-16 code units with a final ``…``; an escaped text is never cut inside
    an ``&amp;``-style entity, which Slack would show half-written."""
    if sum(map(_utf16_units, text)) <= limit:
        return text
    kept, units = 0, 0
    for char in text:
        units += _utf16_units(char)
        if units > limit - 1:  # one unit is left for the "…"
            break
        kept += 1
    cut = text[:kept]
    if escaped:
        amp = cut.rfind("&")
        if amp != -1 and ";" not in cut[amp:]:
            cut = cut[:amp]
    return cut + "…"


def _escape(text: str) -> str:
    # The three characters Slack's mrkdwn reserves for links and mentions.
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _slack_facts(message: AlertMessage) -> str:
    lines = [f"*Run:* {_escape(message.run)}"]
    # The checkpoint named is the latest finding's: its step is the last step it fired at.
    at = message.last_step if message.last_step is not None else message.step
    if message.checkpoint is not None or at is not None:
        where = _escape(message.checkpoint) if message.checkpoint is not None else ""
        if at is not None:
            where = f"{where} (step {at})" if where else f"step {at}"
        lines.append(f"*Checkpoint:* {where}")
    if message.first_step is not None and message.first_step != at:
        lines.append(f"*Onset:* step {message.first_step}")
    if message.resolved_step is not None:
        lines.append(f"*Resolved at:* step {message.resolved_step}")
    if message.task is not None:
        lines.append(f"*Task:* {_escape(message.task)}")
    if message.metric is not None:
        lines.append(f"*Metric:* {_escape(message.metric)}")
    if message.value is not None or message.baseline is not None:
        value = "none" if message.value is None else _short_text(message.value)
        if message.baseline is not None:
            value += f" (baseline {_short_text(message.baseline)})"
        lines.append(f"*Value:* {value}")
    if message.best_step is not None:
        lines.append(f"*Best step:* {message.best_step}")
    if message.rollback_step is not None:
        lines.append(f"*Last good step:* {message.rollback_step}")
    if message.links:
        links = " · ".join(f"<{_escape(url)}|{_escape(name)}>" for name, url in sorted(message.links.items()))
        lines.append(f"*Links:* {links}")
    return "\n".join(lines)


def _slack(message: AlertMessage) -> dict[str, Any]:
    firing = message.state == "firing"
    emoji = _SEVERITY_EMOJI[message.severity] if firing else _RESOLVED_EMOJI
    news = _news(message).upper()
    header = f"{emoji} {message.state.upper()}{news} · {message.severity}: {message.rule} on {message.run}"
    context = f"fingerprint `{_escape(message.fingerprint)}` · id `{_escape(message.id)}`"
    context += f" · since {_timestamp(message.starts_at)}"
    if message.ends_at is not None:
        context += f" · resolved {_timestamp(message.ends_at)}"
    blocks: list[dict[str, Any]] = [
        {
            "type": "header",
            "text": {"type": "plain_text", "text": _fit(header, SLACK_HEADER_LIMIT, escaped=False)},
        },
        {
            "type": "section",
            "text": {"type": "mrkdwn", "text": _fit(_slack_facts(message), SLACK_TEXT_LIMIT)},
        },
    ]
    if message.message.strip():
        text = _fit(_escape(message.message), SLACK_TEXT_LIMIT)
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": text}})
    blocks.append(
        {"type": "context", "elements": [{"type": "mrkdwn", "text": _fit(context, SLACK_TEXT_LIMIT)}]}
    )
    first_line = message.message.strip().split("\n", 1)[0]
    fallback = f"{emoji} {_summary(message)}" + (f" — {first_line}" if first_line else "")
    return {"text": _fit(_escape(fallback), SLACK_TEXT_LIMIT), "blocks": blocks}


def _alertmanager_labels(message: AlertMessage) -> dict[str, str]:
    labels = {"alertname": message.rule, "run": message.run, "severity": message.severity}
    # Alertmanager drops empty labels; an absent task or metric is left out the same way.
    if message.task:
        labels["task"] = message.task
    if message.metric:
        labels["metric"] = message.metric
    return labels


def _alertmanager_annotations(message: AlertMessage) -> dict[str, str]:
    annotations = {"summary": _summary(message), "event": message.why}
    if message.message:
        annotations["description"] = message.message
    if message.value is not None:
        annotations["value"] = _exact_text(message.value)
    if message.baseline is not None:
        annotations["baseline"] = _exact_text(message.baseline)
    for name, number in (
        ("step", message.step),
        ("first_step", message.first_step),
        ("last_step", message.last_step),
        ("resolved_step", message.resolved_step),
        ("best_step", message.best_step),
        ("rollback_step", message.rollback_step),
    ):
        if number is not None:
            annotations[name] = str(number)
    if message.checkpoint is not None:
        annotations["checkpoint"] = message.checkpoint
    # The Prometheus convention for links in annotations: runbook_url, dashboard_url, ...
    annotations.update({f"{name}_url": url for name, url in message.links.items()})
    return annotations


def _group_key(labels: Mapping[str, str]) -> str:
    # Alertmanager's form for the root route grouping by every label: {}:{name="value", ...}; stable
    # across firing and resolved, so a receiver pairs the two notifications.
    pairs = ", ".join(
        f"{name}={json.dumps(value, ensure_ascii=False)}" for name, value in sorted(labels.items())
    )
    return f"{{}}:{{{pairs}}}"


def _alertmanager(message: AlertMessage) -> dict[str, Any]:
    labels = _alertmanager_labels(message)
    annotations = _alertmanager_annotations(message)
    alert = {
        "status": message.state,
        "labels": labels,
        "annotations": annotations,
        "startsAt": _timestamp(message.starts_at),
        "endsAt": ZERO_TIME if message.ends_at is None else _timestamp(message.ends_at),
        "generatorURL": message.links.get(GENERATOR_LINK, ""),
        "fingerprint": message.fingerprint,
    }
    return {
        "version": ALERTMANAGER_VERSION,
        "groupKey": _group_key(labels),
        "truncatedAlerts": 0,
        "status": message.state,
        "receiver": ALERTMANAGER_RECEIVER,
        "groupLabels": labels,
        "commonLabels": labels,
        "commonAnnotations": annotations,
        "externalURL": "",
        "alerts": [alert],
    }


_RENDERERS: Mapping[str, Callable[[AlertMessage], dict[str, Any]]] = {
    "generic": _generic,
    "slack": _slack,
    "alertmanager": _alertmanager,
}
