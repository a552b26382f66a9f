"""Storage errors.

Hierarchy::

    EvaldError                evald.errors: the root, shared with the daemon's errors and inference's
    └── StorageError
        ├── DatabaseUnreachable   the server cannot be reached, the connection was lost, or the file
        │                         cannot be opened or written (busy, disk full): worth retrying later
        ├── StatementFailed       the database refused a statement (a constraint, a bad query): a bug,
        │                         not an outage, so never retried
        ├── SchemaOutdated        the database is not at the newest migration: run ``evald db upgrade``
        ├── InstanceLocked        another daemon already owns this SQLite database
        └── SamplesUnavailable    storage.queries.samples: the samples asked for are not stored (the
                                  message lists what is)
"""

from evald.errors import EvaldError


class StorageError(EvaldError):
    """Base of every error raised by :mod:`storage`."""


class DatabaseUnreachable(StorageError):
    pass


class StatementFailed(StorageError):
    pass


class SchemaOutdated(StorageError):
    pass


class InstanceLocked(StorageError):
    pass
