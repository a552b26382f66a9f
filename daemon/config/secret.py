"""The webhook signing secret: read from its variable or file, decoded, and never shown.

Config validation reads it as the webhook sender will, so ``evald config check`` and a reload refuse
what a start would.

Secrets are written ``whsec_`` followed by the base64 of the key bytes; like the reference libraries of
Standard Webhooks (https://www.standardwebhooks.com/), a secret without the prefix is read as base64 too, so
both ends of a webhook agree on the key whichever form the operator pasted.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path

from daemon.config.errors import SecretError

SECRET_PREFIX = "whsec_"

# A secret is one line; anything bigger is the wrong file (a log, a key bundle), not a long secret.
_MAX_SECRET_FILE_BYTES = 4096


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
