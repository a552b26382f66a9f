"""``[executor.ray]``: the Ray cluster evaluations run on (``[executor] kind = "ray"``), what each rank
asks of it, and the job's runtime environment.

A complete section::

    [executor]
    kind = "ray"
    job_dir = "/shared/evald/jobs"          # a folder the daemon and every Ray node share
    time_limit = "2:00:00"

    [executor.ray]
    address = "ray://head:10001"            # or "auto", "head:6379", "http://head:8265"
    namespace = "evald"
    num_cpus = 4                            # per rank (one bundle a rank)
    num_gpus = 1
    resources = { "a100" = 1 }
    placement_strategy = "STRICT_PACK"      # a job's ranks on one node, started together
    env_vars = ["HF_HOME"]                  # passed by name from the daemon's environment
    driver_python = "/opt/evald/bin/python"
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from daemon.config.base import Section

#: Ray's placement strategies for a job's bundles (one bundle a rank).
PlacementStrategy = Literal["STRICT_PACK", "PACK", "SPREAD", "STRICT_SPREAD"]

#: Ray's own resource names: set with ``num_cpus``/``num_gpus``, not as custom resources.
_RAY_BUILTIN_RESOURCES = frozenset({"CPU", "GPU", "memory", "object_store_memory"})


class RayConfig(Section):
    """``[executor.ray]``: the Ray cluster, what each rank asks of it, and the job's runtime environment.

    Each evald job is one Ray job (Jobs API) whose driver reserves a placement group of tp × dp bundles
    and starts one rank a bundle; see docs/how-to/ray.md."""

    #: The cluster: ``auto`` (a Ray node on the daemon's host), ``ray://head:10001`` (the Ray Client
    #: port), ``head:6379`` (the GCS) or ``http://head:8265`` (the dashboard, where the Jobs API answers:
    #: the others are resolved to it).
    address: str = "auto"
    #: The Ray namespace of each job's driver and placement group.
    namespace: str = Field(default="evald", pattern=r"^[A-Za-z0-9_.-]+$")
    #: CPUs per rank (a bundle's ``CPU``).
    num_cpus: float = Field(default=1.0, ge=0)
    #: GPUs per rank; None: 1 for a CUDA job ([inference] device), else 0.
    num_gpus: float | None = Field(default=None, ge=0)
    #: Custom resources per rank (``{ "node_type_a100" = 1 }``), beside ``num_cpus`` and ``num_gpus``.
    resources: dict[str, float] = Field(default_factory=dict)
    #: How the tp × dp bundles are placed: ``STRICT_PACK`` (one node, the default: a job's ranks start
    #: together on one node), ``PACK``, ``SPREAD`` or ``STRICT_SPREAD`` (one node a rank).
    placement_strategy: PlacementStrategy = "STRICT_PACK"
    #: Seconds a job's placement group may wait for its bundles before the job ends ``timeout``
    #: (retried within ``max_attempts``); None: no limit (it waits as a queued Slurm job does, its
    #: reason in ``evald status``).
    placement_timeout_secs: float | None = Field(default=None, gt=0)
    #: Seconds a job's placement group may stay INFEASIBLE — Ray's word for bundles no node of the
    #: cluster can hold as it is (a custom resource no node declares, more CPUs or GPUs than a node has,
    #: ``STRICT_PACK`` ranks no one node fits) — before the job fails ``infeasible``, naming what it asked
    #: for: not retried (another attempt would ask the same), so its queue slot is freed and an
    #: ``eval_failed`` alert fires. The wait lets an autoscaler add such a node (a slow one: set more).
    infeasible_timeout_secs: float = Field(default=600.0, gt=0)
    #: runtime_env ``pip``: packages installed for the job (``["evald[ray]==0.9"]``); not with ``conda``.
    pip: tuple[str, ...] = ()
    #: runtime_env ``conda``: an existing environment's name or path on the nodes; not with ``pip``.
    conda: str | None = None
    #: runtime_env ``working_dir``: a local folder uploaded to the nodes, or a URI (``s3://…/code.zip``).
    working_dir: str | None = None
    #: Variables passed to the job's runtime_env ``env_vars``, by name, with their values in the
    #: daemon's environment (an allow-list: nothing else of the daemon's environment reaches the
    #: cluster, where anyone with the dashboard reads a job's runtime_env). A name unset here is left out.
    env_vars: tuple[str, ...] = ()
    #: The interpreter that runs each job's driver on the cluster (it needs ``ray``); None: the
    #: executor's ``python`` (the ranks' interpreter), else the daemon's.
    driver_python: str | None = None

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        text = value.strip()
        if not text or any(c.isspace() for c in text):
            raise ValueError(
                f"{value!r} is not a Ray address (auto, ray://head:10001, head:6379, http://head:8265)"
            )
        scheme = text.split("://", 1)[0] if "://" in text else ""
        if scheme not in ("", "ray", "http", "https"):
            raise ValueError(f"{value!r}: a Ray address is auto, ray://…, host:port or http(s)://…")
        return text

    @field_validator("resources")
    @classmethod
    def _resources(cls, value: dict[str, float]) -> dict[str, float]:
        problems = []
        for name, amount in value.items():
            if name in _RAY_BUILTIN_RESOURCES:
                problems.append(f"{name!r} is Ray's own: set num_cpus / num_gpus instead")
            elif amount < 0:
                problems.append(f"{name!r} = {amount}: an amount is 0 or more")
        if problems:
            raise ValueError("; ".join(problems))
        return value

    @field_validator("env_vars")
    @classmethod
    def _env_vars(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        bad = [name for name in value if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name)]
        if bad:
            raise ValueError(f"not variable names: {', '.join(map(repr, bad))}")
        return value

    @field_validator("conda")
    @classmethod
    def _pip_or_conda(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and info.data.get("pip"):
            raise ValueError("Ray takes pip or conda in one runtime_env, not both")
        return value

    def runtime_env(self, env: dict[str, str]) -> dict[str, object]:
        """The Ray ``runtime_env`` of a job, with ``env`` as its variables."""
        out: dict[str, object] = {"env_vars": dict(env)}
        if self.pip:
            out["pip"] = list(self.pip)
        if self.conda is not None:
            out["conda"] = self.conda
        if self.working_dir is not None:
            out["working_dir"] = self.working_dir
        return out
