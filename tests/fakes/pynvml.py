"""A stand-in for ``pynvml`` (nvidia-ml-py): the NVIDIA driver is the one part that cannot exist here.

Only the calls :mod:`daemon.scheduling.resources` makes are implemented, with the real module's names, its
``NVMLError`` classes and its rule that nothing works before ``nvmlInit``. The GPUs are read afresh on
every call from the JSON file named by ``EVALD_FAKE_NVML``, so a test can make a GPU busy or free while a
daemon process is running::

    {"gpus": [{"name": "NVIDIA H100", "free_mib": 1000, "total_mib": 81559, "util": 95}]}
    {"error": "driver_not_loaded"}

How tests use it (``tests/fakes/nvml_state.py`` does both and writes the file):

- in the test process, put this module in ``sys.modules["pynvml"]`` (``monkeypatch.setitem``), or put
  ``tests/fakes`` at the front of ``sys.path`` before anything imports pynvml;
- for a daemon subprocess, put ``tests/fakes`` at the front of its ``PYTHONPATH``.

Without ``EVALD_FAKE_NVML`` every call raises ``RuntimeError``: a test that forgot the state file should
fail, not look like a node without GPUs.
"""

# The names mirror pynvml's, which are not PEP 8.
# ruff: noqa: N801, N802

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STATE_ENV = "EVALD_FAKE_NVML"
MIB = 1024**2

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

_MESSAGES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML Error with code {self.value}")


class NVMLError_Uninitialized(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_UNINITIALIZED)


class NVMLError_InvalidArgument(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_INVALID_ARGUMENT)


class NVMLError_DriverNotLoaded(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_DRIVER_NOT_LOADED)


class NVMLError_LibraryNotFound(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_LIBRARY_NOT_FOUND)


class NVMLError_GpuIsLost(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_GPU_IS_LOST)


class NVMLError_Unknown(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_UNKNOWN)


#: The values of ``"error"`` in the state file.
ERRORS: dict[str, Callable[[], NVMLError]] = {
    "driver_not_loaded": NVMLError_DriverNotLoaded,
    "library_not_found": NVMLError_LibraryNotFound,
    "gpu_is_lost": NVMLError_GpuIsLost,
    "unknown": NVMLError_Unknown,
}


@dataclass(frozen=True)
class c_nvmlDevice_t:
    index: int


@dataclass(frozen=True)
class c_nvmlMemory_t:
    total: int
    free: int
    used: int


@dataclass(frozen=True)
class c_nvmlUtilization_t:
    gpu: int
    memory: int


_initialised = 0


def _gpus() -> list[dict[str, Any]]:
    """The GPUs in the state file now; raises the NVMLError it names."""
    path = os.environ.get(STATE_ENV)
    if not path:
        raise RuntimeError(f"the fake pynvml needs {STATE_ENV} set to its JSON state file")
    state = json.loads(Path(path).read_text(encoding="utf-8"))
    if "error" in state:
        raise ERRORS[state["error"]]()
    gpus: list[dict[str, Any]] = state["gpus"]
    return gpus


def _initialised_gpus() -> list[dict[str, Any]]:
    if not _initialised:
        raise NVMLError_Uninitialized()
    return _gpus()


def _gpu(handle: c_nvmlDevice_t) -> dict[str, Any]:
    gpus = _initialised_gpus()
    if handle.index >= len(gpus):
        raise NVMLError_GpuIsLost()
    return gpus[handle.index]


def nvmlInit() -> None:
    global _initialised
    _gpus()
    # Like the real library: initialisations are counted and each needs its own nvmlShutdown.
    _initialised += 1


def nvmlShutdown() -> None:
    global _initialised
    if not _initialised:
        raise NVMLError_Uninitialized()
    _initialised -= 1


def nvmlDeviceGetCount() -> int:
    return len(_initialised_gpus())


def nvmlDeviceGetHandleByIndex(index: int) -> c_nvmlDevice_t:
    if not 0 <= index < len(_initialised_gpus()):
        raise NVMLError_InvalidArgument()
    return c_nvmlDevice_t(index)


def nvmlDeviceGetName(handle: c_nvmlDevice_t) -> str | bytes:
    gpu = _gpu(handle)
    name = str(gpu.get("name", "NVIDIA H100 80GB HBM3"))
    # Releases of nvidia-ml-py before 11.515 returned bytes.
    return name.encode() if gpu.get("name_as_bytes") else name


def nvmlDeviceGetMemoryInfo(handle: c_nvmlDevice_t) -> c_nvmlMemory_t:
    gpu = _gpu(handle)
    total, free = int(gpu["total_mib"] * MIB), int(gpu["free_mib"] * MIB)
    return c_nvmlMemory_t(total=total, free=free, used=total - free)


def nvmlDeviceGetUtilizationRates(handle: c_nvmlDevice_t) -> c_nvmlUtilization_t:
    gpu = _gpu(handle)
    return c_nvmlUtilization_t(gpu=int(gpu.get("util", 0)), memory=int(gpu.get("memory_util", 0)))
