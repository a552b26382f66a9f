"""What a worker process inherits from the daemon: an allow-list, not the daemon's whole environment.

A worker gets everything it needs to evaluate in its spec file; its environment carries only what the
process itself needs, and any process of the same user can read it in ``/proc/PID/environ``. So a
variable reaches a worker only if it is

- one a worker needs by name (:data:`WORKER_NAMES`: PATH, HOME, USER, LANG, TZ, TMPDIR, LD_LIBRARY_PATH,
  the compilers DeepSpeed's and Triton's JIT builds look for, the fault injections of
  :mod:`inference.faults`) or by prefix (:data:`WORKER_PREFIXES`: locale, Python, CUDA/NVIDIA/NCCL/ROCm,
  torch/DeepSpeed/Triton, the thread pools, Hugging Face, XDG, the CA bundle), unless its name says it is
  a credential (``HF_TOKEN``: the worker runs offline);
- or listed in ``[inference] worker_env`` (a reward function's settings, say);

and never one of the daemon's secrets (the dashboard token named by ``[web] token_env``, the webhooks'
``secret_env``, ``EVALD_<SECTION>_<FIELD>`` overrides such as the database URL) nor a launcher's rank
variables. Then the daemon adds the tie to itself and the GPUs evaluations may use.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from daemon.config import Config, env_overrides
from daemon.config.worker_env import LAUNCHER_VARIABLES, WORKER_NAMES
from inference.spec import PARENT_PID_ENV

#: Variables a worker needs, by prefix: the libraries it runs and the hardware they drive.
WORKER_PREFIXES = (
    "LC_",
    "PYTHON",
    "CUDA_",
    "NVIDIA_",
    "NCCL_",
    "GLOO_",
    "CUBLAS_",
    "CUDNN_",
    "HIP_",
    "ROCR_",
    "HSA_",
    "TORCH_",
    "TORCHINDUCTOR_",
    "PYTORCH_",
    "DS_",
    "TRITON_",
    "OMP_",
    "KMP_",
    "MKL_",
    "OPENBLAS_",
    "HF_",
    "TRANSFORMERS_",
    "TOKENIZERS_",
    "XDG_",
    "SSL_CERT_",
)

#: A name whose ``_``-separated parts include one of these holds a credential: left out even under an
#: allowed prefix (``HF_TOKEN``), unless ``worker_env`` lists it. ``TOKENIZERS_PARALLELISM`` is no token.
CREDENTIAL_PARTS = frozenset(
    {"TOKEN", "SECRET", "SECRETS", "PASSWORD", "PASSWD", "PASS", "CREDENTIAL", "CREDENTIALS", "KEY", "APIKEY"}
)


def needed(name: str) -> bool:
    """Whether a worker inherits ``name`` without being told (the allow-list above)."""
    if name in WORKER_NAMES:
        return True
    if not name.startswith(WORKER_PREFIXES):
        return False
    return not CREDENTIAL_PARTS.intersection(name.upper().split("_"))


def secret_variables(config: Config) -> frozenset[str]:
    """Variables that hold the daemon's secrets (webhook secrets, the database URL with its password,
    the web token): a worker needs none of them, and any process can read another's
    ``/proc/PID/environ`` when it runs as the same user."""
    names = {hook.secret_env for hook in config.webhooks if hook.secret_env}
    if config.web.token_env:
        names.add(config.web.token_env)
    # EVALD_<SECTION>_<FIELD> overrides (EVALD_DATABASE_URL with its password) are the daemon's config:
    # the worker gets all it needs in its spec file.
    names.update(env_overrides())
    return frozenset(names)


def worker_environment(config: Config, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """What a worker inherits of ``environ`` (the daemon's own by default): the allow-list and
    ``[inference] worker_env``, less the daemon's secrets; plus the tie to this process and the GPUs
    evaluations may use."""
    source = os.environ if environ is None else environ
    hidden = LAUNCHER_VARIABLES | secret_variables(config)
    extra = frozenset(config.inference.worker_env)
    env = {k: v for k, v in source.items() if k not in hidden and (k in extra or needed(k))}
    env[PARENT_PID_ENV] = str(os.getpid())
    if not config.inference.device.startswith("cuda"):
        # DeepSpeed's launcher picks its accelerator at import, as the workers do (they set this too).
        env.setdefault("DS_ACCELERATOR", "cpu")
    gpus = config.scheduling.resources.gpus
    if gpus is not None and config.inference.device.startswith("cuda"):
        # The configured indices are NVML's, which follow the PCI bus order.
        env.update(CUDA_DEVICE_ORDER="PCI_BUS_ID", CUDA_VISIBLE_DEVICES=",".join(map(str, gpus)))
    return env
