"""Config errors besides :class:`daemon.errors.ConfigError`: a webhook secret that cannot be read.

Hierarchy::

    EvaldError                   (daemon.errors)
    └── SecretError              the webhook secret could not be loaded or parsed (the message says
                                 which source and what is wrong, never the secret itself)
"""

from daemon.errors import EvaldError


class SecretError(EvaldError):
    pass
