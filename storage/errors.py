"""Storage errors.

Hierarchy::

    StorageError
    ├── DatabaseUnreachable   the server cannot be reached or the file cannot be opened
    ├── SchemaOutdated        the database is not at the newest migration: run ``evald db upgrade``
    └── InstanceLocked        another daemon already owns this SQLite database
"""


class StorageError(Exception):
    """Base of every error raised by :mod:`storage`."""


class DatabaseUnreachable(StorageError):
    pass


class SchemaOutdated(StorageError):
    pass


class InstanceLocked(StorageError):
    pass
