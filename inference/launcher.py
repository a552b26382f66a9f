"""Start a job's worker group: ``torchrun`` on one node, the ``deepspeed`` launcher across several.

The daemon runs ``python -m inference.launcher -- <launcher command>``: this process ties itself to the
daemon (it dies if the daemon dies), puts its own pid in ``EVALD_PARENT_PID`` so that every rank ties
itself to it, and execs the launcher in place (same pid, so the ties hold). Under DeepSpeed's launcher
(``--untied``) the ranks' parent is DeepSpeed's per-node launcher: the ranks on this node watch the
daemon's pid instead, and remote ranks rely on DeepSpeed's launcher to stop them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from inference.spec import PARENT_PID_ENV, InferenceSpec


def worker_command(
    spec: InferenceSpec,
    spec_path: Path,
    *,
    python: str,
    hostfile: Path | None,
    launcher_args: Sequence[str] = (),
) -> list[str]:
    """The command the daemon runs for a job: one worker process, or a launcher of ``tp × dp`` ranks
    (``launcher_args`` go to torchrun or DeepSpeed's launcher as they are)."""
    worker = ["--module", "inference.worker", str(spec_path)]
    if spec.world_size == 1:
        return [python, "-m", "inference.worker", str(spec_path)]
    if hostfile is not None:
        # One rank per slot of the hostfile, whose slots the config checked add up to tp × dp; ranks read
        # LOCAL_RANK from the environment, so no --local_rank argument.
        group = [python, "-m", "deepspeed.launcher.runner", "--hostfile", str(hostfile), "--no_local_rank"]
        return [python, "-m", "inference.launcher", "--untied", "--", *group, *launcher_args, *worker]
    group = [
        python,
        "-m",
        "torch.distributed.run",
        # A free rendezvous port of its own, so that concurrent jobs never collide.
        "--standalone",
        "--nnodes=1",
        f"--nproc-per-node={spec.world_size}",
        "--max-restarts=0",
        *launcher_args,
        *worker,
    ]
    return [python, "-m", "inference.launcher", "--", *group]


def main(argv: Sequence[str] | None = None) -> int:
    from inference.lifeline import DAEMON_PID_ENV, die_with_parent

    args = list(sys.argv[1:] if argv is None else argv)
    untied = args[:1] == ["--untied"]
    if untied:
        args = args[1:]
    if args[:1] != ["--"] or len(args) < 2:
        print("usage: python -m inference.launcher [--untied] -- COMMAND...", file=sys.stderr)
        return 2
    command = args[1:]
    die_with_parent()
    env = dict(os.environ)
    if untied:
        daemon = env.pop(PARENT_PID_ENV, None)
        if daemon is not None:
            env[DAEMON_PID_ENV] = daemon
    else:
        env[PARENT_PID_ENV] = str(os.getpid())
    os.execvpe(command[0], command, env)


if __name__ == "__main__":
    sys.exit(main())
