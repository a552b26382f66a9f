"""What a worker process inherits from the daemon: its environment, less what would mislead or leak.

A worker gets everything it needs to evaluate in its spec file; its environment carries only what the
process itself needs (the GPUs, the libraries' settings) and the tie to the daemon that started it.
"""

from __future__ import annotations

import os

from daemon.config import Config, env_overrides
from inference.spec import PARENT_PID_ENV

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


def secret_variables(config: Config) -> frozenset[str]:
    """Variables that hold the daemon's secrets (webhook secrets, the database URL with its password,
    the web token): a worker needs none of them, and any process can read another's
    ``/proc/PID/environ`` when it runs as the same user."""
    names = {hook.secret_env for hook in config.webhooks if hook.secret_env}
    # EVALD_<SECTION>_<FIELD> overrides (EVALD_DATABASE_URL with its password) are the daemon's config:
    # the worker gets all it needs in its spec file.
    names.update(env_overrides())
    return frozenset(names)


def worker_environment(config: Config) -> dict[str, str]:
    """The daemon's environment less its secrets, plus the tie to this process and the GPUs evaluations
    may use."""
    hidden = LAUNCHER_VARIABLES | secret_variables(config)
    env = {k: v for k, v in os.environ.items() if k not in hidden}
    env[PARENT_PID_ENV] = str(os.getpid())
    if not config.inference.device.startswith("cuda"):
        # DeepSpeed's launcher picks its accelerator at import, as the workers do (they set this too).
        env.setdefault("DS_ACCELERATOR", "cpu")
    gpus = config.scheduling.resources.gpus
    if gpus is not None and config.inference.device.startswith("cuda"):
        # The configured indices are NVML's, which follow the PCI bus order.
        env.update(CUDA_DEVICE_ORDER="PCI_BUS_ID", CUDA_VISIBLE_DEVICES=",".join(map(str, gpus)))
    return env
