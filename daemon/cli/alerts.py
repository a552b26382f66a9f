"""``evald alerts``: what fired, when, and whether it was delivered."""

from __future__ import annotations

import argparse
import json

from daemon.analysis import report
from daemon.cli.base import database_url, open_current
from storage import alerting


def cmd_alerts(args: argparse.Namespace) -> int:
    database = open_current(database_url(args))
    try:
        with database.session() as session:
            rows = alerting.alert_rows(session, run=args.run, state=args.state)
    finally:
        database.dispose()
    if args.format == "json":
        print(json.dumps([report.alert_json(row) for row in rows], indent=1, default=str))
    else:
        print(report.alerts_text(rows))
    return 0
