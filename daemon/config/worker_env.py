"""The environment variable names ``[inference] worker_env`` may list, and the ones a worker needs by name.

A worker never inherits a launcher's rank variables, the daemon's own ``EVALD_`` settings or libpq's
connection settings, so the config refuses to list them; :mod:`daemon.running.environment` applies these
rules when it builds a worker's environment.
"""

from __future__ import annotations

import re

from inference.faults import DIVERGE_ENV, OOM_ABOVE_ENV

#: Set by a launcher for its ranks; inherited by the daemon (started from a training job's shell, say),
#: they would make a worker think it is one rank of a group that does not exist.
LAUNCHER_VARIABLES = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "LOCAL_SIZE",
        "GROUP_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
    }
)

#: Variables a worker needs, by name.
WORKER_NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "LD_LIBRARY_PATH",
        # DeepSpeed's and Triton's JIT builds of their ops (the CPU shared-memory all-reduce, kernels).
        "CC",
        "CXX",
        "MAX_JOBS",
        # Faults a test injects into a real worker (the daemon never sets them).
        OOM_ABOVE_ENV,
        DIVERGE_ENV,
    }
)

#: libpq's connection settings, the password among them: the daemon's, never a worker's.
LIBPQ_VARIABLES = frozenset(
    {
        "PGHOST",
        "PGHOSTADDR",
        "PGPORT",
        "PGDATABASE",
        "PGUSER",
        "PGPASSWORD",
        "PGPASSFILE",
        "PGSERVICE",
        "PGSERVICEFILE",
        "PGOPTIONS",
        "PGAPPNAME",
        "PGSSLMODE",
        "PGSSLCERT",
        "PGSSLKEY",
        "PGSSLROOTCERT",
    }
)

#: The variables the daemon itself reads: its own configuration, never a worker's.
DAEMON_PREFIX = "EVALD_"

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def refused_extra(name: str) -> str | None:
    """Why ``[inference] worker_env`` may not list ``name`` (None when it may)."""
    if not _NAME.match(name):
        return f"{name!r} is not an environment variable name (letters, digits and _, not first a digit)"
    if name in LAUNCHER_VARIABLES:
        return f"{name} is set by the launcher for each rank: an inherited one would break the worker group"
    if name.startswith(DAEMON_PREFIX) and name not in WORKER_NAMES:
        return f"{name} is the daemon's own configuration: a worker gets its settings in its spec file"
    if name in LIBPQ_VARIABLES:
        return f"{name} is a PostgreSQL client setting (the daemon's): a worker never opens the database"
    return None
