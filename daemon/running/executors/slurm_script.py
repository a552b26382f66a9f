"""What a Slurm job of evald is: its name and comment, how its ranks sit on nodes, its batch script,
and the environment ``sbatch`` passes on; pure functions of the config and the job's spec.

The job folder holds ``spec.json`` in; ``result.json``, ``result.rank<N>.json``, ``rank-<N>.log`` out;
plus ``job.sbatch`` (the script as submitted), ``worker.log`` (its output), ``slurm_job_id`` (written by
the daemon after ``sbatch`` and by the script when it starts) and ``exit.json`` (the worker's exit status,
written by the script as it ends).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, unquote

from daemon.config import ExecutorConfig
from daemon.running.executors.base import ExecutorError, JobRef
from inference.spec import PARENT_PID_ENV, JobSpec

SCRIPT_NAME = "job.sbatch"
LOG_NAME = "worker.log"
EXIT_NAME = "exit.json"
ID_NAME = "slurm_job_id"

#: Variables of the daemon's own that a batch job must not inherit: the daemon's lifeline (a worker on
#: another node would wait for a pid that is not there) and an allocation the daemon itself may run in.
_NOT_INHERITED = (PARENT_PID_ENV, "EVALD_DAEMON_PID")


@dataclass(frozen=True)
class Layout:
    """How a job's ``tp × dp`` ranks sit on Slurm's nodes."""

    nodes: int
    tasks_per_node: int
    cpus_per_task: int
    #: GPUs per node (one a rank) for a CUDA job, else 0.
    gpus_per_node: int

    @property
    def ranks(self) -> int:
        return self.nodes * self.tasks_per_node


def job_name(prefix: str, job: JobRef) -> str:
    return f"{prefix}-{job.job_id}-{job.attempt}"


def comment(prefix: str, job: JobRef) -> str:
    # No spaces: scontrol -o prints the comment unquoted among KEY=VALUE pairs.
    return f"{prefix}:job={job.job_id}:attempt={job.attempt}:run={quote(job.run, safe='')}"


def parse_comment(prefix: str, text: str) -> JobRef | None:
    """The evald job a comment of :func:`comment`'s names; None for anyone else's job."""
    head, _, rest = text.partition(":")
    if head != prefix:
        return None
    fields = dict(part.split("=", 1) for part in rest.split(":") if "=" in part)
    try:
        return JobRef(
            job_id=int(fields["job"]), attempt=int(fields["attempt"]), run=unquote(fields.get("run", ""))
        )
    except (KeyError, ValueError):
        return None


def probe_script(config: ExecutorConfig, folder: Path, comment: str = "", also: Sequence[Path] = ()) -> str:
    """The job folder probe's script: it copies ``folder/token`` (with its node's name) to ``folder/seen``,
    then what it reads of each file of ``also`` (the token placed in another folder the nodes must see),
    a line each, empty where it cannot; ``comment`` says whose it is (a dead daemon's is cancelled by the
    next)."""
    quoted = shlex.quote(str(folder))
    options = [
        f"--job-name={config.name_prefix}-probe",
        *([f"--comment={comment}"] if comment else []),
        f"--partition={config.partition}",
        "--time=1",
        "--ntasks=1",
        # Not in the folder: where the node does not see it, the job must still run and say so.
        "--output=/dev/null",
        "--chdir=/tmp",
        "--no-requeue",
        *([f"--account={config.account}"] if config.account else []),
        *([f"--qos={config.qos}"] if config.qos else []),
        *([f"--exclude={config.exclude}"] if config.exclude else []),
        *config.extra_sbatch,
    ]
    return "\n".join(
        [
            "#!/bin/bash",
            *(f"#SBATCH {option}" for option in options),
            f'{{ cat {quoted}/token && echo " $(hostname)"; }} > {quoted}/seen.tmp || exit 1',
            *(f"{{ cat {shlex.quote(str(f))} 2>/dev/null; echo; }} >> {quoted}/seen.tmp" for f in also),
            f"mv -f {quoted}/seen.tmp {quoted}/seen",
            "",
        ]
    )


def layout(config: ExecutorConfig, spec: JobSpec) -> Layout:
    """How ``spec``'s ranks sit on ``config.nodes`` nodes; :class:`ExecutorError` when they cannot."""
    ranks = spec.inference.world_size
    nodes = min(config.nodes, ranks)
    if ranks % nodes:
        raise ExecutorError(
            f"tp × dp = {ranks} ranks cannot be split evenly over executor.nodes = {config.nodes}"
        )
    per_node = ranks // nodes
    cpus = config.cpus_per_task or spec.inference.threads or 1
    gpus = per_node if spec.inference.device.startswith("cuda") else 0
    return Layout(nodes=nodes, tasks_per_node=per_node, cpus_per_task=cpus, gpus_per_node=gpus)


def batch_script(
    config: ExecutorConfig,
    spec: JobSpec,
    spec_path: Path,
    job: JobRef,
    *,
    python: str,
    time: str,
    failed_nodes: Sequence[str] = (),
) -> str:
    """The script submitted for ``job``: options as ``#SBATCH`` lines (readable, and resubmittable by
    hand with ``sbatch job.sbatch``), then the worker. ``time``: its ``--time``; ``failed_nodes``: nodes
    that failed under the job, kept out beside ``executor.exclude``."""
    folder = spec_path.parent
    ranks_at = layout(config, spec)
    options = _sbatch_options(config, ranks_at, job, folder, time=time, failed_nodes=failed_nodes)
    lines = ["#!/bin/bash", *(f"#SBATCH {option}" for option in options), ""]
    lines += _prologue(config, job, folder)
    if ranks_at.ranks > 1:
        lines += rendezvous(config, shlex.quote(python))
    elif config.rendezvous_interface:
        lines.append(_interface_env(config.rendezvous_interface))
    lines.append(_worker_step(config, ranks_at, python=python, spec_path=spec_path))
    lines += [
        "code=$?",
        # Written once the worker is done, so that its end is known after Slurm forgets the job.
        f'printf \'{{"exit_code": %d, "slurm_job_id": "%s"}}\\n\' "$code" "$SLURM_JOB_ID" '
        f"> {EXIT_NAME}.tmp && mv -f {EXIT_NAME}.tmp {EXIT_NAME}",
        'exit "$code"',
        "",
    ]
    return "\n".join(lines)


def _sbatch_options(
    config: ExecutorConfig,
    ranks_at: Layout,
    job: JobRef,
    folder: Path,
    *,
    time: str,
    failed_nodes: Sequence[str],
) -> list[str]:
    """The job's ``sbatch`` options: its name and comment, where and how long, its ranks, GPUs and
    memory, the nodes kept out, and the site's own options last."""
    options = [
        f"--job-name={job_name(config.name_prefix, job)}",
        f"--comment={comment(config.name_prefix, job)}",
        f"--partition={config.partition}",
        f"--time={time}",
        f"--nodes={ranks_at.nodes}",
        f"--ntasks={ranks_at.ranks}",
        f"--ntasks-per-node={ranks_at.tasks_per_node}",
        f"--cpus-per-task={ranks_at.cpus_per_task}",
        f"--output={folder / LOG_NAME}",
        "--open-mode=append",
        f"--chdir={folder}",
        "--export=ALL",
        "--requeue" if config.requeue else "--no-requeue",
    ]
    if config.account:
        options.append(f"--account={config.account}")
    if config.qos:
        options.append(f"--qos={config.qos}")
    if config.mem:
        options.append(f"--mem={config.mem}")
    exclude = ",".join([*([config.exclude] if config.exclude else []), *failed_nodes])
    if exclude:
        options.append(f"--exclude={exclude}")
    if ranks_at.gpus_per_node:
        options.append(
            f"--gres=gpu:{ranks_at.gpus_per_node}"
            if config.gpu_request == "gres"
            else f"--gpus-per-node={ranks_at.gpus_per_node}"
        )
    options.extend(config.extra_sbatch)
    return options


def _prologue(config: ExecutorConfig, job: JobRef, folder: Path) -> list[str]:
    """The script's first lines: which job it is, into its folder, its Slurm job id written down, and the
    site's setup script sourced."""
    lines = [
        f"# evald job {job.job_id}, attempt {job.attempt}, run {job.run!r}, task {job.task!r}.",
        # No `set -u`: a site's setup script (module init, conda activate) reads unset variables.
        f"cd {shlex.quote(str(folder))} || exit 1",
        f'echo "$SLURM_JOB_ID" > {ID_NAME}',
        'echo "evald: slurm job $SLURM_JOB_ID on $SLURM_JOB_NODELIST" >&2',
    ]
    if config.setup_script is not None:
        lines.append(f"source {shlex.quote(str(config.setup_script))} || exit 1")
    return lines


def _worker_step(config: ExecutorConfig, ranks_at: Layout, *, python: str, spec_path: Path) -> str:
    """The ``srun`` line that starts the worker on every rank."""
    srun = [
        "srun",
        f"--ntasks={ranks_at.ranks}",
        f"--ntasks-per-node={ranks_at.tasks_per_node}",
        f"--cpus-per-task={ranks_at.cpus_per_task}",
        "--kill-on-bad-exit=1",
        *config.srun_options,
    ]
    quoted_python, spec_arg = shlex.quote(python), shlex.quote(str(spec_path))
    # Every rank, a single one too, is a task of srun: its options (a container: pyxis's
    # --container-image) apply to each; a rank that fails ends the others (--kill-on-bad-exit).
    return (
        " ".join(shlex.quote(word) for word in srun) + " "
        'bash -c \'export RANK="$SLURM_PROCID" LOCAL_RANK="$SLURM_LOCALID" '
        f'WORLD_SIZE="$SLURM_NTASKS" LOCAL_WORLD_SIZE={ranks_at.tasks_per_node}; '
        f'exec "$0" -m inference.worker "$1"\' {quoted_python} {spec_arg}'
    )


#: The IPv4 address of the interface ``$1`` (SIOCGIFADDR), printed by a Python of the node.
_ADDRESS_OF = (
    "import fcntl, socket, struct, sys; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
    "name = struct.pack('256s', sys.argv[1].encode()); "
    "print(socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, name)[20:24]))"
)
_FREE_PORT = 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'


def _interface_env(interface: str) -> str:
    return f"export GLOO_SOCKET_IFNAME={interface} NCCL_SOCKET_IFNAME={interface}"


def rendezvous(config: ExecutorConfig, python: str) -> list[str]:
    """The lines that set the ranks' rendezvous. The batch script runs on the allocation's first node,
    where rank 0 runs: ``MASTER_ADDR`` is its hostname, or its address on ``rendezvous_interface`` (the
    job fails at once, saying so, where that interface has none); ``MASTER_PORT`` a port free on it now
    (two evald jobs may share a node). A Python of the node asks (the daemon's, else ``python3``: the
    workers' may be a container's)."""
    interface = config.rendezvous_interface
    port = shlex.quote(_FREE_PORT)
    lines = []
    if interface is None:
        lines.append('MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"')
    else:
        ask = shlex.quote(_ADDRESS_OF)
        lines += [
            _interface_env(interface),
            f'MASTER_ADDR="$({python} -c {ask} {interface} 2>/dev/null || python3 -c {ask} {interface})"',
            'if [ -z "$MASTER_ADDR" ]; then',
            f'  echo "evald: executor.rendezvous_interface {interface} has no IPv4 address on $(hostname)'
            ' (ip -br addr lists the interfaces)" >&2',
            "  exit 1",
            "fi",
        ]
    lines += [
        f'MASTER_PORT="$({python} -c {port} 2>/dev/null || python3 -c {port})"',
        "export MASTER_ADDR MASTER_PORT",
        'echo "evald: rendezvous $MASTER_ADDR:$MASTER_PORT" >&2',
    ]
    return lines


def submission_environment(env: Mapping[str, str], config: ExecutorConfig) -> dict[str, str]:
    """The environment ``sbatch`` (and so the job, ``--export=ALL``) gets: the worker environment less
    the daemon's lifeline and any allocation of the daemon's own (``SLURM_*``; ``SLURM_CONF`` stays)."""
    out = {
        k: v
        for k, v in env.items()
        if k not in _NOT_INHERITED and not (k.startswith("SLURM_") and k != "SLURM_CONF")
    }
    if config.slurm_conf is not None:
        out["SLURM_CONF"] = str(config.slurm_conf)
    return out
