"""The root of every error evald raises, below the three packages so that each can derive from it.

Hierarchy (each package's ``errors.py`` draws its own part)::

    EvaldError
    ├── InferenceError      inference.errors: a worker's input was rejected (its kind says which)
    ├── RewardFailed        inference.rewards: one call of a reward function failed (a sample's problem)
    ├── StorageError        storage.errors: the database could not be reached, or refused a statement
    └── (the daemon's)      daemon.errors: config, jobs, delivery, executors, object stores, the API

``except EvaldError`` catches whatever evald itself means to report (the CLI prints it as one line);
anything else is a bug or a library's error not yet converted at its boundary. The worker and the
database know nothing of the daemon, nor of each other: this module imports nothing.
"""


class EvaldError(Exception):
    """Base of every error evald raises on purpose."""
