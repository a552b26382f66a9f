"""``evald demo``: a tiny model trained while evald evaluates every checkpoint it saves."""

from __future__ import annotations

import argparse
from pathlib import Path

from daemon.demo import run_demo


def cmd_demo(args: argparse.Namespace) -> int:
    workdir = Path(args.workdir) if args.workdir else None
    return run_demo(workdir, as_json=args.json, serve=args.serve, port=args.port)
