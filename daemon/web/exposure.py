"""Who can reach ``evald serve``: a non-loopback address without a token opens prompts, responses and
checkpoint paths to the network, so it is refused unless asked for by name.

Pure rules over the host string and the ``[web]`` section: ``evald serve`` refuses with
:func:`open_problem`'s text, ``evald config check`` prints it as a warning.
"""

from __future__ import annotations

import ipaddress

from daemon.config import WebConfig

#: Names that mean this machine only (any other name may resolve to a reachable address).
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


def is_loopback(host: str) -> bool:
    """True when ``host`` binds this machine only: 127.0.0.0/8, ::1 or localhost. ``0.0.0.0``, ``::``,
    another address or a host name that may resolve elsewhere are not."""
    name = host.strip().strip("[]").lower()
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def open_problem(web: WebConfig, host: str) -> str | None:
    """Why serving on ``host`` without a token is unsafe, or None (loopback, or a token is required)."""
    if web.token_env is not None or is_loopback(host):
        return None
    return (
        f"host {host!r} is reachable from other machines and no token is required ([web] token_env is "
        "unset): prompts, responses and checkpoint paths would be open to anyone who reaches the port. "
        "Set [web] token_env (and that variable), or bind 127.0.0.1 behind a proxy that authenticates; "
        "to serve it open anyway pass --insecure-no-token or set [web] allow_open = true"
    )
