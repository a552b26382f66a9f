"""Delivery errors: a sink's word on what it could not deliver, and a webhook request that fails verification.

Hierarchy::

    EvaldError                   (daemon.errors)
    ├── DeliveryError
    │   ├── SignatureInvalid     a webhook request failed verification (the message names the check)
    │   └── AttachFileError      daemon.delivery.sinks.mlflow_attach: a trainer's MLflow run id file
    │                            that holds no run id (the message names the file and the fix)
    └── SinkError                a delivery that did not happen: the relay records it (the outbox row's
        │                        last error) and decides
        ├── SinkUnavailable      down, unreachable, slow, 5xx: tried again after a backoff, nothing is lost
        ├── SinkRefused          the credentials were refused: the sink pauses, messages wait
        ├── SinkRejected         this message can never be taken: given up (after ``after`` tries)
        └── SinkGone             the endpoint is gone for good (410): it is disabled, its messages too

The webhook secret's own error, :class:`daemon.config.SecretError`, is the config's.
"""

from __future__ import annotations

from daemon.errors import EvaldError


class DeliveryError(EvaldError):
    """Base of the delivery errors a person sees."""


class SignatureInvalid(DeliveryError):
    pass


class SinkError(EvaldError):
    """A delivery that did not happen; ``str(exc)`` is what the outbox row keeps as its last error.

    ``status`` is the receiver's HTTP status where it answered one (kept in the attempt's history instead
    of an error text), ``retry_after`` its ``Retry-After`` in seconds, ``answer`` the start of its body."""

    def __init__(
        self, why: str, *, status: int | None = None, retry_after: float | None = None, answer: str = ""
    ) -> None:
        super().__init__(why)
        self.status = status
        self.retry_after = retry_after
        self.answer = answer


class SinkUnavailable(SinkError):
    """Down, unreachable, slow or answering 5xx: try again after a backoff; nothing is lost."""


class SinkRefused(SinkError):
    """The credentials were refused (401/403): the sink pauses; evaluation goes on, messages wait."""


class SinkRejected(SinkError):
    """This message can never be taken (malformed for the tracker, or a 4xx): given up once it was tried
    ``after`` times, so it stops blocking its run; until then retried like :class:`SinkUnavailable`.
    Raised for a call that carried several messages, the relay sends them again one by one to find it."""

    def __init__(
        self,
        why: str,
        *,
        after: int = 1,
        status: int | None = None,
        retry_after: float | None = None,
        answer: str = "",
    ) -> None:
        super().__init__(why, status=status, retry_after=retry_after, answer=answer)
        self.after = after


class SinkGone(SinkError):
    """The endpoint is gone (410 Gone): it is disabled, with its pending messages, until re-enabled."""
