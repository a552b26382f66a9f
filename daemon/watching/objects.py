"""An S3-compatible store seen from one run: its client, the prefix listed page by page, ranged reads, and
every error sorted once into the store being away, access refused, or one object's own problem.

boto3 is an optional extra (``evald[s3]``), imported only here and only for a run whose root is ``s3://``.
botocore's own retries are off: the listing retries a page with exponential back-off and jitter a few
times, then gives up the pass (:class:`StoreUnavailable`), so a store that does not answer holds the
daemon's loop for a bounded time and the next rescan tries again.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from daemon.config.object_store import S3Config, split_url
from daemon.errors import EvaldError

T = TypeVar("T")

#: Tries per request (the first included) before the store counts as away for this pass.
TRIES = 3
#: The first back-off between tries, in seconds; doubled each time, with jitter.
BACKOFF_SECS = 0.25
#: The pieces a ranged GET is read in while it streams into its file.
STREAM_BYTES = 1024 * 1024
#: Error codes that say the credentials or the permissions are wrong: no retry mends them.
_REFUSED_CODES = frozenset(
    {
        "AccessDenied",
        "AllAccessDisabled",
        "AuthorizationHeaderMalformed",
        "ExpiredToken",
        "InvalidAccessKeyId",
        "InvalidToken",
        "SignatureDoesNotMatch",
        "NoSuchBucket",
        "InvalidBucketName",
        "PermanentRedirect",
    }
)
_GONE_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
_CHANGED_CODES = frozenset({"PreconditionFailed", "412"})


class StoreError(EvaldError):
    """Something went wrong talking to the store (the base of the classes below)."""


class StoreUnavailable(StoreError):
    """The store did not answer, or answered with a server error or throttling: try again later."""


class StoreRefused(StoreError):
    """The store refused the run's credentials or permissions, or the bucket is not there: the run waits
    until the config (or the store's policy) is fixed."""


class ObjectGone(StoreError):
    """The object was deleted after it was listed."""


class ObjectChanged(StoreError):
    """The object was replaced after it was listed (its ETag no longer matches)."""


@dataclass(frozen=True)
class ObjectInfo:
    """One object under the run's prefix, from the listing."""

    #: The key below the prefix (``step_100/model.safetensors``).
    relkey: str
    size: int
    #: ``LastModified`` in nanoseconds since the epoch (S3 gives whole seconds).
    mtime_ns: int
    etag: str


def classify(exc: BaseException) -> StoreError:
    """The store error that ``exc`` (a botocore exception, or a connection error under it) is."""
    from botocore import exceptions as bexc

    if isinstance(exc, StoreError):
        return exc
    if isinstance(exc, bexc.NoCredentialsError | bexc.PartialCredentialsError):
        return StoreRefused(f"no usable credentials: {exc}")
    if isinstance(exc, bexc.ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        message = f"{code or status}: {error.get('Message') or exc}"
        if code in _GONE_CODES or status == 404:
            return ObjectGone(message)
        if code in _CHANGED_CODES or status == 412:
            return ObjectChanged(message)
        if code in _REFUSED_CODES or status in (400, 401, 403):
            return StoreRefused(message)
        return StoreUnavailable(message)
    if isinstance(exc, bexc.BotoCoreError | OSError):
        return StoreUnavailable(f"{type(exc).__name__}: {exc}")
    return StoreUnavailable(f"{type(exc).__name__}: {exc}")


def credentials(settings: S3Config, environ: Mapping[str, str]) -> dict[str, str]:
    """boto3's credential arguments from the variables ``settings`` names; :class:`StoreRefused` naming a
    variable that is not set. Empty when none is named (boto3's own chain then applies)."""
    found: dict[str, str] = {}
    for argument, name in (
        ("aws_access_key_id", settings.access_key_env),
        ("aws_secret_access_key", settings.secret_key_env),
        ("aws_session_token", settings.session_token_env),
    ):
        if name is None:
            continue
        value = environ.get(name)
        if not value:
            raise StoreRefused(f"environment variable {name} is not set")
        found[argument] = value
    return found


class Store:
    """The run's bucket and prefix, reached with its own client (made on first use)."""

    def __init__(self, settings: S3Config, url: str, environ: Mapping[str, str] | None = None) -> None:
        self.settings = settings
        self.url = url
        self.bucket, self.prefix = split_url(url)
        self._environ = os.environ if environ is None else environ
        self._client: Any = None

    @property
    def variables(self) -> str:
        """The credential variables this run names, for a line saying they were refused."""
        names = [
            n
            for n in (
                self.settings.access_key_env,
                self.settings.secret_key_env,
                self.settings.session_token_env,
            )
            if n is not None
        ]
        return ", ".join(names) if names else "boto3's default credential chain (AWS_* variables, ~/.aws)"

    def key(self, relkey: str) -> str:
        return f"{self.prefix}/{relkey}" if self.prefix else relkey

    @property
    def client(self) -> Any:
        if self._client is None:
            import boto3
            from botocore.config import Config

            config = Config(
                region_name=self.settings.region,
                connect_timeout=self.settings.timeout_secs,
                read_timeout=self.settings.timeout_secs,
                retries={"total_max_attempts": 1},
                max_pool_connections=max(10, self.settings.max_concurrency * 2),
                s3={"addressing_style": "path"} if self.settings.endpoint_url else {},
                signature_version="s3v4",
            )
            session = boto3.session.Session(**credentials(self.settings, self._environ))
            self._client = session.client("s3", endpoint_url=self.settings.endpoint_url, config=config)
        return self._client

    def call(self, what: Callable[[], T], *, tries: int = TRIES) -> T:
        """``what()`` with back-off on the store being away; other errors are raised classified at once."""
        for attempt in range(tries):
            try:
                return what()
            except Exception as exc:
                error = classify(exc)
                if not isinstance(error, StoreUnavailable) or attempt == tries - 1:
                    raise error from exc
            time.sleep(BACKOFF_SECS * 2**attempt * (0.5 + random.random()))
        raise AssertionError("unreachable")  # pragma: no cover

    def pages(
        self, relprefix: str = "", *, tries: int = TRIES, direct: bool = False
    ) -> Iterator[list[ObjectInfo]]:
        """Every object under the prefix (or ``relprefix`` below it), a listing page at a time; with
        ``direct``, only those right in it (not in its "sub-folders")."""
        base = self.key(relprefix) if relprefix else self.prefix
        prefix = f"{base}/" if base else ""
        token: str | None = None
        while True:
            arguments: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix, "MaxKeys": 1000}
            if token is not None:
                arguments["ContinuationToken"] = token
            if direct:
                arguments["Delimiter"] = "/"
            page = self.call(lambda a=arguments: self.client.list_objects_v2(**a), tries=tries)  # type: ignore[misc]
            start = len(self.prefix) + 1 if self.prefix else 0
            yield [
                ObjectInfo(
                    relkey=item["Key"][start:],
                    size=int(item["Size"]),
                    mtime_ns=int(item["LastModified"].timestamp()) * 1_000_000_000,
                    etag=str(item.get("ETag", "")).strip('"'),
                )
                for item in page.get("Contents", ())
            ]
            if not page.get("IsTruncated"):
                return
            token = page.get("NextContinuationToken")
            if not token:
                raise StoreUnavailable("the listing said it was truncated but gave no continuation token")

    def listing(self, relprefix: str = "", *, tries: int = TRIES, direct: bool = False) -> list[ObjectInfo]:
        return [info for page in self.pages(relprefix, tries=tries, direct=direct) for info in page]

    def uploads(self, *, tries: int = TRIES) -> list[ObjectInfo]:
        """Multipart uploads in progress under the prefix, each as its parts so far: the key, the bytes
        uploaded and when the last part came (S3 lists the object itself only once it completes)."""
        found = []
        prefix = f"{self.prefix}/" if self.prefix else ""
        start = len(prefix)
        arguments: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
        while True:
            page = self.call(lambda a=dict(arguments): self.client.list_multipart_uploads(**a), tries=tries)  # type: ignore[misc]
            for upload in page.get("Uploads", ()):
                size, last = 0, int(upload["Initiated"].timestamp()) * 1_000_000_000
                parts = self.call(
                    lambda u=upload: self.client.list_parts(  # type: ignore[misc]
                        Bucket=self.bucket, Key=u["Key"], UploadId=u["UploadId"], MaxParts=1000
                    ),
                    tries=tries,
                )
                for part in parts.get("Parts", ()):
                    size += int(part["Size"])
                    last = max(last, int(part["LastModified"].timestamp()) * 1_000_000_000)
                found.append(ObjectInfo(str(upload["Key"])[start:], size, last, str(upload["UploadId"])))
            if not page.get("IsTruncated"):
                return found
            arguments["KeyMarker"] = page.get("NextKeyMarker")
            arguments["UploadIdMarker"] = page.get("NextUploadIdMarker")

    def read(self, relkey: str, start: int, end: int, etag: str | None = None) -> bytes:
        """Bytes ``start..end`` (inclusive) of an object, only while its ETag is ``etag``."""
        arguments: dict[str, Any] = {
            "Bucket": self.bucket,
            "Key": self.key(relkey),
            "Range": f"bytes={start}-{end}",
        }
        if etag:
            arguments["IfMatch"] = f'"{etag}"'

        def get() -> bytes:
            body = self.client.get_object(**arguments)["Body"]
            try:
                data: bytes = body.read()
            finally:
                body.close()
            return data

        data = self.call(get)
        if len(data) != end - start + 1:
            raise StoreUnavailable(f"{relkey}: asked for {end - start + 1} bytes, got {len(data)}")
        return data

    def read_into(
        self, relkey: str, start: int, end: int, etag: str, sink: Callable[[int, bytes], None]
    ) -> None:
        """Bytes ``start..end`` (inclusive) of an object, only while its ETag is ``etag``, handed to
        ``sink(offset, data)`` a megabyte at a time as they arrive (no buffer of the whole range). A try
        cut short starts the range again: ``sink`` must take the same bytes twice."""
        arguments: dict[str, Any] = {
            "Bucket": self.bucket,
            "Key": self.key(relkey),
            "Range": f"bytes={start}-{end}",
            "IfMatch": f'"{etag}"',
        }

        def get() -> None:
            body = self.client.get_object(**arguments)["Body"]
            offset = start
            try:
                for piece in body.iter_chunks(STREAM_BYTES):
                    sink(offset, piece)
                    offset += len(piece)
            finally:
                body.close()
            if offset != end + 1:
                raise StoreUnavailable(f"{relkey}: the answer ended at byte {offset} of {start}..{end}")

        self.call(get)

    def part_size(self, relkey: str) -> int | None:
        """The size of part 1 of a multipart upload (to check its ETag), if the store tells it."""
        try:
            # No If-Match here: some stores answer a part's HEAD with the part's own ETag. The digest check
            # that follows compares the bytes with the listed ETag anyway.
            head = self.call(
                lambda: self.client.head_object(Bucket=self.bucket, Key=self.key(relkey), PartNumber=1)
            )
        except StoreError:
            return None
        size = head.get("ContentLength")
        return int(size) if isinstance(size, int) and size > 0 else None
