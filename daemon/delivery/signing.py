"""Standard Webhooks signatures (https://www.standardwebhooks.com/): the three headers a webhook
request carries and their verification.

The signed content is ``{webhook-id}.{webhook-timestamp}.{body}``; the signature is the base64 of its
HMAC-SHA256 under the secret's key, sent as ``v1,<signature>``. The secret itself, read and decoded, is
the config's (:mod:`daemon.config.secret`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import time
from collections.abc import Mapping

from daemon.config import Secret
from daemon.delivery.errors import SignatureInvalid

ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
DEFAULT_TOLERANCE_S = 300

# The id travels as a header value: visible ASCII only, so no header injection and no encoding games.
_ID_PATTERN = re.compile(r"[\x21-\x7e]+")
# ASCII digits only: str.isdigit() would also accept other scripts' digits, which senders never write.
_TIMESTAMP_PATTERN = re.compile(r"[0-9]{1,15}")


def _digest(secret: Secret, msg_id: str, timestamp: str, body: bytes) -> bytes:
    content = msg_id.encode() + b"." + timestamp.encode() + b"." + body
    return hmac.new(secret.reveal(), content, hashlib.sha256).digest()


def sign(secret: Secret, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The ``webhook-id``, ``webhook-timestamp`` and ``webhook-signature`` headers for ``body``, sent at
    ``timestamp`` (integer seconds since the epoch)."""
    if not _ID_PATTERN.fullmatch(msg_id):
        raise ValueError(
            f"a webhook id is visible ASCII without spaces (it is a header value), not {msg_id!r}"
        )
    if isinstance(timestamp, bool) or not isinstance(timestamp, int) or timestamp < 0:
        raise ValueError(f"a webhook timestamp is a non-negative integer of seconds, not {timestamp!r}")
    stamp = str(timestamp)
    signature = base64.b64encode(_digest(secret, msg_id, stamp, body)).decode("ascii")
    return {ID_HEADER: msg_id, TIMESTAMP_HEADER: stamp, SIGNATURE_HEADER: f"v1,{signature}"}


def verify(
    secret: Secret,
    headers: Mapping[str, str],
    body: bytes,
    *,
    now: float | None = None,
    tolerance_s: int = DEFAULT_TOLERANCE_S,
) -> None:
    """Raises :class:`SignatureInvalid` unless ``body`` was signed with ``secret`` within ``tolerance_s``
    seconds of ``now`` (either way: a timestamp from the future is as suspect as a stale one).

    ``webhook-signature`` may list several space-separated signatures (a sender rotating its secret signs
    with both keys); one matching ``v1`` signature is enough, entries of other versions are ignored.
    """
    if tolerance_s < 0:
        raise ValueError(f"tolerance_s is a number of seconds, 0 or more, not {tolerance_s}")
    lowered = {name.lower(): value for name, value in headers.items()}
    missing = [name for name in (ID_HEADER, TIMESTAMP_HEADER, SIGNATURE_HEADER) if not lowered.get(name)]
    if missing:
        raise SignatureInvalid(f"missing header{'s' if len(missing) > 1 else ''}: {', '.join(missing)}")
    msg_id, stamp, signatures = lowered[ID_HEADER], lowered[TIMESTAMP_HEADER], lowered[SIGNATURE_HEADER]

    if not _TIMESTAMP_PATTERN.fullmatch(stamp):
        raise SignatureInvalid(f"{TIMESTAMP_HEADER} is not an integer number of seconds: {stamp[:40]!r}")
    age = (time.time() if now is None else now) - int(stamp)
    if age > tolerance_s:
        raise SignatureInvalid(
            f"{TIMESTAMP_HEADER} {stamp} is too old: {age:.0f}s ago, beyond the {tolerance_s}s tolerance"
        )
    if -age > tolerance_s:
        raise SignatureInvalid(
            f"{TIMESTAMP_HEADER} {stamp} is too new: {-age:.0f}s in the future, "
            f"beyond the {tolerance_s}s tolerance"
        )

    expected = _digest(secret, msg_id, stamp, body)
    checked = malformed = 0
    for entry in signatures.split():
        version, _, encoded = entry.partition(",")
        if version != "v1":
            continue
        try:
            candidate = base64.b64decode(encoded, validate=True)
        except binascii.Error:
            malformed += 1
            continue
        checked += 1
        if hmac.compare_digest(expected, candidate):
            return
    detail = f"{checked} v1 signature{'s' if checked != 1 else ''} checked"
    if malformed:
        detail += f", {malformed} not base64"
    raise SignatureInvalid(f"no {SIGNATURE_HEADER} entry matches the body signed with this secret ({detail})")
