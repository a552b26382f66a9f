"""Standard Webhooks signatures (https://www.standardwebhooks.com/): the three headers a webhook
request carries and their verification.

The signed content is ``{webhook-id}.{webhook-timestamp}.{body}``; the signature is the base64 of its
HMAC-SHA256 under the secret's key, sent as ``v1,<signature>``. Secrets are written ``whsec_`` followed by
the base64 of the key bytes; like the reference libraries, a secret without the prefix is read as base64
too, so both ends of a webhook agree on the key whichever form the operator pasted.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import secrets
import stat
import time
from collections.abc import Mapping
from pathlib import Path

from daemon.alerts.errors import SecretError, SignatureInvalid

ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
SECRET_PREFIX = "whsec_"
DEFAULT_TOLERANCE_S = 300

# A secret is one line; anything bigger is the wrong file (a log, a key bundle), not a long secret.
_MAX_SECRET_FILE_BYTES = 4096
# The id travels as a header value: visible ASCII only, so no header injection and no encoding games.
_ID_PATTERN = re.compile(r"[\x21-\x7e]+")
# ASCII digits only: str.isdigit() would also accept other scripts' digits, which senders never write.
_TIMESTAMP_PATTERN = re.compile(r"[0-9]{1,15}")


class Secret:
    """A webhook signing key that never shows itself: ``repr``, ``str`` and f-strings print a mask, so
    logging a config object or an exception that holds one cannot leak it."""

    __slots__ = ("_key",)

    def __init__(self, key: bytes) -> None:
        if not isinstance(key, bytes):
            raise TypeError(f"a Secret's key is bytes, not {type(key).__name__}")
        if not key:
            raise SecretError("the webhook secret is empty")
        self._key = key

    @classmethod
    def parse(cls, text: str) -> Secret:
        """``whsec_<base64>`` or bare ``<base64>`` (missing ``=`` padding is tolerated, as the reference
        libraries do); surrounding whitespace, such as a file's final newline, is ignored."""
        encoded = text.strip().removeprefix(SECRET_PREFIX)
        try:
            key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
        except binascii.Error:
            # The text itself stays out of the message: it is the secret, or close to it.
            raise SecretError(
                "the webhook secret is not base64: Standard Webhooks secrets are 'whsec_' followed by the "
                "base64 of the key (to use a passphrase, base64-encode it: printf %s PASSPHRASE | base64)"
            ) from None
        return cls(key)

    @classmethod
    def generate(cls, size: int = 32) -> Secret:
        """A new random key; the spec asks for 24 to 64 bytes."""
        if not 24 <= size <= 64:
            raise ValueError(f"a webhook secret is 24 to 64 bytes, not {size}")
        return cls(secrets.token_bytes(size))

    def reveal(self) -> bytes:
        """The key bytes, for signing; named so that a reviewer sees every place the key leaves."""
        return self._key

    def reveal_text(self) -> str:
        """The key as ``whsec_<base64>``, to hand to the other end of the webhook."""
        return SECRET_PREFIX + base64.b64encode(self._key).decode("ascii")

    def __repr__(self) -> str:
        return "Secret('**********')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        return hmac.compare_digest(self._key, other._key)

    def __hash__(self) -> int:
        # Equal secrets must hash equal; a constant does that without deriving anything from the key.
        return hash(Secret)

    def __copy__(self) -> Secret:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> Secret:
        return self

    def __reduce__(self) -> str | tuple[object, ...]:
        # Pickling would write the key into whatever the pickle lands in (a queue, a file, a core dump).
        raise TypeError("a webhook Secret cannot be pickled; load it again where it is needed")


def load_secret(*, env: str | None, file: Path | None, environ: Mapping[str, str]) -> Secret:
    """The secret from exactly one of the environment variable ``env`` or the file ``file``.

    A file that grants any permission to group or others is refused, as ssh refuses such private keys:
    a secret anyone on the host can read authenticates nothing. On Kubernetes set ``defaultMode: 0400``
    on the secret volume; systemd's ``LoadCredential=`` files are private already.
    """
    if env is not None and file is not None:
        raise SecretError(
            f"the webhook secret is given both as environment variable {env} and as file {file}; give one"
        )
    if env is not None:
        return _secret_from_env(env, environ)
    if file is not None:
        return _secret_from_file(file)
    raise SecretError("no webhook secret given: name an environment variable or a file that holds it")


def _secret_from_env(name: str, environ: Mapping[str, str]) -> Secret:
    if not name:
        raise SecretError("the webhook secret's environment variable name is empty")
    value = environ.get(name)
    if value is None:
        raise SecretError(f"environment variable {name}, which should hold the webhook secret, is not set")
    if not value.strip():
        raise SecretError(f"environment variable {name}, which should hold the webhook secret, is empty")
    try:
        return Secret.parse(value)
    except SecretError as exc:
        raise SecretError(f"environment variable {name}: {exc}") from None


def _secret_from_file(path: Path) -> Secret:
    try:
        # One descriptor for the permission check and the read, so the file cannot change in between;
        # O_NONBLOCK so a FIFO put there by mistake is refused instead of blocking the daemon's start.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise SecretError(f"webhook secret file {path} does not exist") from None
    except OSError as exc:
        raise SecretError(f"webhook secret file {path} cannot be opened: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SecretError(f"webhook secret file {path} is not a regular file")
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077:
            raise SecretError(
                f"webhook secret file {path} is accessible by group or others (mode {mode:04o}); "
                f"make it private with: chmod 600 {path}"
            )
        data = _read_at_most(fd, _MAX_SECRET_FILE_BYTES + 1)
    except OSError as exc:
        raise SecretError(f"webhook secret file {path} cannot be read: {exc.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > _MAX_SECRET_FILE_BYTES:
        raise SecretError(
            f"webhook secret file {path} is larger than {_MAX_SECRET_FILE_BYTES} bytes; "
            "it should hold the secret alone, on one line"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SecretError(f"webhook secret file {path} is not UTF-8 text") from None
    if not text.strip():
        raise SecretError(f"webhook secret file {path} is empty")
    try:
        return Secret.parse(text)
    except SecretError as exc:
        raise SecretError(f"webhook secret file {path}: {exc}") from None


def _read_at_most(fd: int, size: int) -> bytes:
    chunks: list[bytes] = []
    while size > 0 and (chunk := os.read(fd, size)):
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


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
