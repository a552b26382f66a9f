"""``[database]``: where results are kept (SQLite or PostgreSQL), and how long to wait for it."""

from __future__ import annotations

from pydantic import Field, ValidationInfo, field_validator

from daemon.config.base import Section, base_dir
from daemon.config.database_url import DEFAULT_URL, beside


class DatabaseConfig(Section):
    """Where results, checkpoints and the job queue are kept, and how long to wait for the database."""

    #: ``sqlite:///FILE`` (one daemon; a relative path is beside the config) or ``postgresql://...``
    #: (several daemons share it); keep a password in ``EVALD_DATABASE_URL``, not in the file.
    url: str = Field(default=DEFAULT_URL, validate_default=True)
    #: How long the daemon keeps trying to reach the database at start before it exits non-zero (and
    #: its supervisor starts it again). Once running, it waits out any outage, however long.
    start_timeout_secs: float = Field(default=60.0, ge=0)
    #: The longest wait between two tries while the database is away (the waits double up to it).
    retry_max_secs: float = Field(default=5.0, gt=0)

    @field_validator("url")
    @classmethod
    def _relative_sqlite(cls, url: str, info: ValidationInfo) -> str:
        return beside(url, base_dir(info))
