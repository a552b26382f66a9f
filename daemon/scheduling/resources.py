"""What a job needs free on the node before it may start: GPU memory, GPU utilisation, host memory.

:func:`evaluate` is pure: thresholds and readings in, what is unmet out. The readings are the edges:
:func:`read_gpus` asks NVML (``pynvml``, from nvidia-ml-py) and :func:`read_host` asks psutil.

A GPU threshold that cannot be checked (the job runs on the CPU, or there is no NVIDIA driver) is *not
applicable*, never unmet: the same config must work on a laptop and on the training node.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType

import psutil
import structlog

from daemon.config.scheduling import Thresholds as Thresholds
from daemon.errors import EvaldError
from daemon.units import format_bytes

log = structlog.get_logger("evald.resources")

#: The config field each threshold comes from, as messages name them.
GPU_FREE_FIELD = "min_gpu_free_memory"
GPU_UTILIZATION_FIELD = "max_gpu_utilization"
HOST_FREE_FIELD = "min_host_free_memory"


@dataclass(frozen=True)
class GpuReading:
    #: The NVML index (PCI bus order).
    index: int
    name: str
    free_bytes: int
    total_bytes: int
    utilization_percent: float


@dataclass(frozen=True)
class HostReading:
    available_bytes: int
    total_bytes: int


class GpusUnavailable(EvaldError):
    """NVML could not be asked: no library, no driver, no such GPU. ``reason`` says which."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Check:
    #: One line per threshold not met, naming the GPU or the host, the reading and the threshold.
    unmet: tuple[str, ...]
    #: One line per threshold that was set but could not be checked, and why.
    not_applicable: tuple[str, ...]

    @property
    def met(self) -> bool:
        return not self.unmet

    @property
    def reason(self) -> str:
        return "; ".join(self.unmet)


# --- the pure core ---


def evaluate(
    thresholds: Thresholds,
    *,
    gpus: Sequence[GpuReading] | GpusUnavailable | None,
    host: HostReading | None,
) -> Check:
    """Which thresholds the readings fail, and which cannot be checked.

    ``gpus`` is ``None`` when the job uses no GPU, the exception when NVML could not be asked, else a
    reading of every GPU the job uses (each must meet the GPU thresholds). ``host`` may be ``None`` only
    when no host threshold is set.
    """
    unmet: list[str] = []
    not_applicable: list[str] = []
    gpu_fields = [
        name
        for name, value in (
            (GPU_FREE_FIELD, thresholds.min_gpu_free_bytes),
            (GPU_UTILIZATION_FIELD, thresholds.max_gpu_utilization_percent),
        )
        if value is not None
    ]
    if gpus is None:
        why = "the job runs on the CPU"
    elif isinstance(gpus, GpusUnavailable):
        why = f"no NVIDIA GPU: {gpus.reason}"
    elif not gpus:
        why = "no GPU to check"
    else:
        why = ""
        for gpu in gpus:
            unmet.extend(_gpu_unmet(thresholds, gpu))
    if why:
        not_applicable.extend(f"{name}: not applicable ({why})" for name in gpu_fields)

    if thresholds.min_host_free_bytes is not None:
        if host is None:
            raise ValueError(f"{HOST_FREE_FIELD} is set but no host reading was given")
        if host.available_bytes < thresholds.min_host_free_bytes:
            reading, threshold = _bytes_pair(host.available_bytes, thresholds.min_host_free_bytes)
            unmet.append(f"host: available memory {reading} < {HOST_FREE_FIELD} {threshold}")
    return Check(unmet=tuple(unmet), not_applicable=tuple(not_applicable))


def _gpu_unmet(thresholds: Thresholds, gpu: GpuReading) -> list[str]:
    unmet = []
    if thresholds.min_gpu_free_bytes is not None and gpu.free_bytes < thresholds.min_gpu_free_bytes:
        reading, threshold = _bytes_pair(gpu.free_bytes, thresholds.min_gpu_free_bytes)
        unmet.append(f"gpu {gpu.index}: free memory {reading} < {GPU_FREE_FIELD} {threshold}")
    limit = thresholds.max_gpu_utilization_percent
    if limit is not None and gpu.utilization_percent > limit:
        unmet.append(
            f"gpu {gpu.index}: utilization {gpu.utilization_percent:g}% > {GPU_UTILIZATION_FIELD} {limit:g}%"
        )
    return unmet


def _bytes_pair(reading: int, threshold: int) -> tuple[str, str]:
    # "20.0 GiB < 20.0 GiB" would read as a bug: show exact bytes when rounding hides the difference.
    shown = format_bytes(reading), format_bytes(threshold)
    return shown if shown[0] != shown[1] else (f"{reading} B", f"{threshold} B")


def visible_gpu_indices(
    configured: Sequence[int] | None, environ: Mapping[str, str]
) -> tuple[int, ...] | None:
    """The NVML indices of the GPUs the job will use; ``None`` means every GPU NVML sees.

    CUDA numbers devices fastest first and NVML by PCI bus; on a node of identical GPUs (the usual
    training node) the two orders agree. Set ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` where they may not.
    """
    if configured is not None:
        return tuple(dict.fromkeys(configured))
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return None
    entries = [entry.strip() for entry in listed.split(",") if entry.strip()]
    if not entries:
        # An empty CUDA_VISIBLE_DEVICES hides every GPU from the job.
        return ()
    if all(entry.isdigit() for entry in entries):
        return tuple(dict.fromkeys(int(entry) for entry in entries))
    # GPU-/MIG- UUIDs (or -1) would need a lookup by UUID; checking every GPU is the cautious answer.
    return None


# --- the edges ---

_nvml_lock = threading.Lock()
#: The pynvml module on which nvmlInit last succeeded. NVML stays initialised for the life of the
#: process; a failure resets this so that the next read initialises again (the driver may be back).
_nvml_ready: ModuleType | None = None


def read_gpus(indices: Sequence[int] | None = None) -> list[GpuReading]:
    """Free memory and utilisation of the GPUs at these NVML indices (``None``: all), from NVML.

    Raises :class:`GpusUnavailable` when pynvml, its library or the driver is missing, or an index does
    not exist.
    """
    global _nvml_ready
    try:
        # Imported here so that the daemon runs where nvidia-ml-py is not installed.
        import pynvml  # type: ignore[import-untyped]
    except ImportError as exc:
        raise GpusUnavailable(f"pynvml cannot be imported: {exc}") from exc
    with _nvml_lock:
        try:
            if _nvml_ready is not pynvml:
                pynvml.nvmlInit()
                _nvml_ready = pynvml
            count = int(pynvml.nvmlDeviceGetCount())
            wanted = list(range(count)) if indices is None else list(indices)
            missing = [index for index in wanted if not 0 <= index < count]
            if missing:
                names = ", ".join(str(index) for index in missing)
                raise GpusUnavailable(f"no GPU with index {names}; NVML sees {count} GPU(s)")
            return [_read_gpu(pynvml, index) for index in wanted]
        except pynvml.NVMLError as exc:
            _nvml_ready = None
            raise GpusUnavailable(f"NVML: {exc}") from exc


def _read_gpu(pynvml: ModuleType, index: int) -> GpuReading:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    name = pynvml.nvmlDeviceGetName(handle)
    return GpuReading(
        index=index,
        # Older nvidia-ml-py releases return bytes.
        name=name.decode() if isinstance(name, bytes) else str(name),
        free_bytes=int(memory.free),
        total_bytes=int(memory.total),
        utilization_percent=float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu),
    )


def read_host() -> HostReading:
    """Host memory from psutil: ``available`` counts reclaimable page cache, unlike ``free``."""
    memory = psutil.virtual_memory()
    return HostReading(available_bytes=memory.available, total_bytes=memory.total)


class ResourceProbe:
    """Reads what the thresholds need and evaluates them; one per job kind (GPU or CPU, which GPUs)."""

    def __init__(
        self,
        thresholds: Thresholds,
        *,
        uses_gpu: bool,
        gpu_indices: Sequence[int] | None,
        read_gpus: Callable[[Sequence[int] | None], list[GpuReading]] = read_gpus,
        read_host: Callable[[], HostReading] = read_host,
    ) -> None:
        self.thresholds = thresholds
        self.uses_gpu = uses_gpu
        self.gpu_indices = None if gpu_indices is None else tuple(gpu_indices)
        self._read_gpus = read_gpus
        self._read_host = read_host
        # Deferred jobs are checked again and again: say each not-applicable reason once, not every time.
        self._reported: set[str] = set()

    def check(self) -> Check:
        gpus: Sequence[GpuReading] | GpusUnavailable | None = None
        if self.uses_gpu:
            if self.thresholds.gpu_thresholds_set:
                try:
                    gpus = self._read_gpus(self.gpu_indices)
                except GpusUnavailable as exc:
                    gpus = exc
            else:
                gpus = ()
        host = self._read_host() if self.thresholds.min_host_free_bytes is not None else None
        check = evaluate(self.thresholds, gpus=gpus, host=host)
        for text in check.not_applicable:
            if text not in self._reported:
                self._reported.add(text)
                log.warning("resources.not_applicable", detail=text)
        return check
