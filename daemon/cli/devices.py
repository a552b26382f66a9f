"""Whether the device ``[inference]`` names exists on this host, asked before anything starts.

A worker on a host without CUDA failed its first job with torch's traceback on one line; ``config check``
says it up front, with the fix. Only where the workers run here (the local executor): under Slurm or Ray
they run on other nodes, which this host cannot speak for. Not asked by ``evald run``: the answer needs
torch, which the daemon itself never imports (its memory stays small beside the trainer's).
"""

from __future__ import annotations

from daemon.config import Config


def device_problem(config: Config) -> str | None:
    """Why ``inference.device`` cannot be used by a local worker on this host, or ``None``."""
    device = config.inference.device
    if config.executor.kind != "local" or not device.startswith("cuda"):
        return None
    import torch  # only for a CUDA device, and only here: the check is what torch itself would say

    if not torch.cuda.is_available():
        why = (
            f"this torch ({torch.__version__}) is built without CUDA"
            if torch.version.cuda is None
            else "no NVIDIA GPU or driver is visible to torch"
        )
        return (
            f'inference.device: {device!r}, but {why}: set device = "cpu" to evaluate on the CPU, or run '
            "evald on a GPU node (under Slurm or Ray, executor.kind runs the workers there)"
        )
    ranks = config.inference.tp * config.inference.dp
    visible = torch.cuda.device_count()
    if ranks > visible:
        return (
            f"inference.device: {device!r} with tp × dp = {ranks} ranks, but {visible} GPU(s) are visible "
            "here: lower tp or dp, or make more GPUs visible (CUDA_VISIBLE_DEVICES)"
        )
    return None
