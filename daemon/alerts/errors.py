"""Alert delivery errors.

Hierarchy::

    EvaldError                   (daemon.errors)
    └── AlertError
        ├── SecretError          the webhook secret could not be loaded or parsed (the message says
        │                        which source and what is wrong, never the secret itself)
        └── SignatureInvalid     a webhook request failed verification (the message names the check)
"""

from daemon.errors import EvaldError


class AlertError(EvaldError):
    """Base of the alert errors."""


class SecretError(AlertError):
    pass


class SignatureInvalid(AlertError):
    pass
