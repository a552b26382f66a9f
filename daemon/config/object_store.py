"""``[runs.s3]``: where a run whose ``root`` is ``s3://bucket/prefix`` is listed and downloaded from.

Credentials are named, never written here: the fields hold the names of environment variables, read when
the daemon starts. Unset, boto3's own chain applies (``AWS_*`` variables, ``~/.aws``, an instance role).
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import Field, ValidationInfo, field_validator

from daemon.config.base import Section, resolve_path

SCHEME = "s3://"
#: S3's own bucket naming rules (3..63 characters, lower case, digits, dots and hyphens).
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def is_object_url(value: object) -> bool:
    return isinstance(value, str) and value.startswith(SCHEME)


def split_url(url: str) -> tuple[str, str]:
    """``(bucket, prefix)`` of ``s3://bucket/prefix`` (the prefix without slashes at its ends); a
    ``ValueError`` saying what is wrong otherwise."""
    rest = url.removeprefix(SCHEME)
    bucket, _, prefix = rest.partition("/")
    if not _BUCKET.fullmatch(bucket):
        raise ValueError(
            f"{url!r}: {bucket!r} is not a bucket name (3 to 63 lower-case letters, digits, dots, hyphens)"
        )
    prefix = prefix.strip("/")
    if any(part in ("", ".", "..") for part in prefix.split("/")) and prefix:
        raise ValueError(f"{url!r}: the prefix has an empty, '.' or '..' part")
    return bucket, prefix


class S3Config(Section):
    """How to reach the S3-compatible store a run's checkpoints are uploaded to, and where to keep them."""

    #: The store's endpoint (``https://s3.eu-west-1.amazonaws.com``, a MinIO or Ceph URL); unset: AWS's
    #: own for ``region``.
    endpoint_url: str | None = Field(default=None, pattern=r"^https?://")
    #: The region requests are signed for.
    region: str = "us-east-1"
    #: The NAME of the environment variable holding the access key id (never the key itself); unset:
    #: boto3's credential chain (``AWS_ACCESS_KEY_ID``, ``~/.aws``, an instance role).
    access_key_env: str | None = None
    #: The NAME of the environment variable holding the secret access key.
    secret_key_env: str | None = None
    #: The NAME of the environment variable holding a session token (temporary credentials), if any.
    session_token_env: str | None = None
    #: Where checkpoints are kept locally: the metadata mirror discovery judges (small files only) and
    #: the downloaded copies workers load. Relative paths are to the config file's folder.
    cache_dir: Path = Field(default=Path("~/.cache/evald/objects"), validate_default=True)
    #: The most the downloaded copies may take, in GB: the least recently used are evicted to make room
    #: (a checkpoint larger than this is refused, naming both sizes).
    cache_max_gb: float = Field(default=100.0, gt=0)
    #: Ranged GETs in flight at once while downloading a checkpoint.
    max_concurrency: int = Field(default=8, ge=1, le=64)
    #: The size of each ranged GET, in MB.
    chunk_mb: int = Field(default=16, ge=1, le=1024)
    #: Check each downloaded file against the store's ETag where it is a digest (the MD5 of a single-part
    #: upload, of its parts' MD5s for a multipart one), hashed as the chunks arrive. It costs CPU (about a
    #: third of the download time on two cores, see BENCHMARKS.md); the size is checked either way.
    verify_etags: bool = True
    #: How long to wait for the store to accept a connection or answer a request, in seconds. A store that
    #: hangs holds the first rescan that meets it about three times this long (three tries), each later
    #: one once this long, until it answers again.
    timeout_secs: float = Field(default=10.0, gt=0, le=300)

    @field_validator("access_key_env", "secret_key_env", "session_token_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        if value is not None and not _ENV_NAME.fullmatch(value):
            # The value is not repeated: it may be the credential itself, pasted by mistake.
            raise ValueError(
                "not an environment variable name: give the variable's NAME (for example"
                " AWS_SECRET_ACCESS_KEY), never the credential itself"
            )
        return value

    @field_validator("cache_dir")
    @classmethod
    def _cache_dir(cls, value: Path, info: ValidationInfo) -> Path:
        folder = resolve_path(value, info)
        if folder.exists() and not folder.is_dir():
            raise ValueError(f"not a directory: {folder}")
        return folder

    def mirror_root(self, url: str) -> Path:
        """The local folder that mirrors ``url``'s listing (small files, sparse weights): what the run's
        checkpoints are recorded under, and what discovery judges."""
        bucket, prefix = split_url(url)
        return self.cache_dir / "mirror" / bucket / prefix

    def name_in_mirror(self, url: str, path: Path) -> str | None:
        """The name under ``url``'s prefix of the checkpoint recorded at ``path``: its place in this
        ``cache_dir``'s mirror, or in an earlier one's (``cache_dir`` moved since it was recorded: the
        recorded path keeps the old folder). None where ``path`` is in no mirror of ``url``."""
        root = self.mirror_root(url)
        if path.is_relative_to(root):
            return path.relative_to(root).as_posix()
        bucket, prefix = split_url(url)
        tail = ("mirror", bucket, *(prefix.split("/") if prefix else ()))
        parts = path.parts
        # The last match: a cache_dir may itself sit under a folder called mirror.
        for start in range(len(parts) - len(tail), -1, -1):
            if parts[start : start + len(tail)] == tail:
                # "." where the prefix itself is the checkpoint, as relative_to says.
                return "/".join(parts[start + len(tail) :]) or "."
        return None

    def copy_root(self, url: str) -> Path:
        """The local folder downloaded checkpoints of ``url`` are kept in, one sub-folder each."""
        bucket, prefix = split_url(url)
        return self.cache_dir / "copies" / bucket / prefix
