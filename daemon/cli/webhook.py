"""``evald webhook test``: a signed test alert sent to one configured webhook, and its answer shown."""

from __future__ import annotations

import argparse
import os

from daemon.analysis import report
from daemon.cli.base import load, open_current
from daemon.errors import ConfigError
from storage import outbox


def cmd_webhook_test(args: argparse.Namespace) -> int:
    from daemon.delivery.sinks.webhook import endpoints, send_test

    config = load(args)
    known = {w.name: w for w in config.webhooks}
    if args.name not in known:
        names = ", ".join(known) or "none configured"
        raise ConfigError("webhook", [f"unknown webhook {args.name!r} (known: {names})"])
    # Only this webhook's secret: another's missing one is no reason to refuse a test of this one.
    [target] = endpoints(config.model_copy(update={"webhooks": (known[args.name],)}), os.environ)
    result = send_test(target, config.alerts.links)
    answer = f"HTTP {result.status}" if result.status is not None else "no answer"
    print(f"{args.name}: {answer} in {result.duration_s:.3f} s (webhook-id {result.event_id})")
    if result.detail:
        print(report.one_line(result.detail, 500))
    delivered = result.status is not None and 200 <= result.status < 300
    if delivered:
        # It takes alerts again: one that answered 410 Gone before is enabled for the relay.
        database = open_current(config.database.url)
        try:
            with database.session() as session:
                outbox.enable_endpoint(session, args.name)
        finally:
            database.dispose()
    return 0 if delivered else 1
