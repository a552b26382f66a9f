from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path

import psutil
import pytest
import structlog

from daemon.scheduling import resources
from daemon.scheduling.resources import (
    Check,
    GpuReading,
    GpusUnavailable,
    HostReading,
    ResourceProbe,
    Thresholds,
    evaluate,
    read_gpus,
    read_host,
    visible_gpu_indices,
)
from daemon.units import parse_memory, parse_percent
from tests.fakes.nvml_state import FakeGpu, FakeNvml

GIB = 1024**3
MIB = 1024**2


def _driver_present() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


DRIVER = _driver_present()


@pytest.fixture
def fake_nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    """``import pynvml`` returns the fake for this test; it sees no GPUs until ``set``."""
    return FakeNvml.install(tmp_path, monkeypatch)


def gpu(index: int = 0, *, free_gib: float = 70, util: float = 10, total_gib: float = 80) -> GpuReading:
    return GpuReading(
        index=index,
        name="NVIDIA H100 80GB HBM3",
        free_bytes=int(free_gib * GIB),
        total_bytes=int(total_gib * GIB),
        utilization_percent=util,
    )


def host(available_gib: float = 100, total_gib: float = 256) -> HostReading:
    return HostReading(available_bytes=int(available_gib * GIB), total_bytes=int(total_gib * GIB))


ALL = Thresholds(min_gpu_free_bytes=20 * GIB, max_gpu_utilization_percent=80, min_host_free_bytes=8 * GIB)


# --- evaluate (pure) ---


def test_all_met() -> None:
    check = evaluate(ALL, gpus=[gpu(0), gpu(1)], host=host())
    assert check == Check(unmet=(), not_applicable=())
    assert check.met
    assert check.reason == ""


def test_nothing_set_is_met_without_readings() -> None:
    assert Thresholds().any_set is False
    assert evaluate(Thresholds(), gpus=None, host=None).met


def test_thresholds_report_what_is_set() -> None:
    assert Thresholds(min_gpu_free_bytes=1).gpu_thresholds_set
    assert Thresholds(max_gpu_utilization_percent=50).gpu_thresholds_set
    host_only = Thresholds(min_host_free_bytes=1)
    assert not host_only.gpu_thresholds_set
    assert host_only.any_set


def test_low_gpu_memory() -> None:
    check = evaluate(ALL, gpus=[gpu(1, free_gib=3.2)], host=host())
    assert check.unmet == ("gpu 1: free memory 3.2 GiB < min_gpu_free_memory 20.0 GiB",)
    assert not check.met


def test_busy_gpu() -> None:
    check = evaluate(ALL, gpus=[gpu(0, util=95)], host=host())
    assert check.unmet == ("gpu 0: utilization 95% > max_gpu_utilization 80%",)


def test_low_host_memory() -> None:
    check = evaluate(ALL, gpus=[gpu(0)], host=host(available_gib=1.1))
    assert check.unmet == ("host: available memory 1.1 GiB < min_host_free_memory 8.0 GiB",)


def test_boundaries_are_met() -> None:
    exact = Thresholds(min_gpu_free_bytes=20 * GIB, max_gpu_utilization_percent=80, min_host_free_bytes=GIB)
    assert evaluate(exact, gpus=[gpu(0, free_gib=20, util=80)], host=host(available_gib=1)).met


def test_exact_bytes_when_rounding_would_hide_the_difference() -> None:
    check = evaluate(Thresholds(min_gpu_free_bytes=20 * GIB), gpus=[gpu(0, free_gib=19.99)], host=None)
    assert check.unmet == (f"gpu 0: free memory {int(19.99 * GIB)} B < min_gpu_free_memory {20 * GIB} B",)


def test_every_gpu_the_job_uses_must_meet_the_thresholds() -> None:
    check = evaluate(ALL, gpus=[gpu(0), gpu(1, free_gib=3.2, util=95), gpu(2)], host=host(available_gib=1.1))
    assert check.unmet == (
        "gpu 1: free memory 3.2 GiB < min_gpu_free_memory 20.0 GiB",
        "gpu 1: utilization 95% > max_gpu_utilization 80%",
        "host: available memory 1.1 GiB < min_host_free_memory 8.0 GiB",
    )
    assert check.reason == "; ".join(check.unmet)
    assert check.not_applicable == ()


def test_gpu_thresholds_do_not_apply_to_a_cpu_job() -> None:
    check = evaluate(ALL, gpus=None, host=host())
    assert check.met
    assert check.not_applicable == (
        "min_gpu_free_memory: not applicable (the job runs on the CPU)",
        "max_gpu_utilization: not applicable (the job runs on the CPU)",
    )


def test_gpu_thresholds_do_not_apply_without_nvml() -> None:
    unavailable = GpusUnavailable("NVML: NVML Shared Library Not Found")
    check = evaluate(Thresholds(max_gpu_utilization_percent=80), gpus=unavailable, host=None)
    assert check.met
    assert check.not_applicable == (
        "max_gpu_utilization: not applicable (no NVIDIA GPU: NVML: NVML Shared Library Not Found)",
    )


def test_host_threshold_still_applies_without_gpus() -> None:
    check = evaluate(ALL, gpus=GpusUnavailable("no NVIDIA GPU"), host=host(available_gib=1.1))
    assert check.unmet == ("host: available memory 1.1 GiB < min_host_free_memory 8.0 GiB",)
    assert len(check.not_applicable) == 2


def test_no_gpu_to_check() -> None:
    check = evaluate(Thresholds(min_gpu_free_bytes=GIB), gpus=[], host=None)
    assert check.met
    assert check.not_applicable == ("min_gpu_free_memory: not applicable (no GPU to check)",)


def test_a_host_threshold_without_a_reading_is_a_bug() -> None:
    with pytest.raises(ValueError, match="min_host_free_memory"):
        evaluate(Thresholds(min_host_free_bytes=GIB), gpus=None, host=None)


# --- visible_gpu_indices ---


@pytest.mark.parametrize(
    ("configured", "environ", "expected"),
    [
        ((2, 3), {"CUDA_VISIBLE_DEVICES": "0"}, (2, 3)),
        ([1, 1, 0], {}, (1, 0)),
        (None, {}, None),
        (None, {"CUDA_VISIBLE_DEVICES": "1,3"}, (1, 3)),
        (None, {"CUDA_VISIBLE_DEVICES": " 2 , 0 "}, (2, 0)),
        (None, {"CUDA_VISIBLE_DEVICES": ""}, ()),
        (None, {"CUDA_VISIBLE_DEVICES": "GPU-5f2a9c1e-0b7d-4c1e-9f5e-2d7a1b3c4d5e"}, None),
        (None, {"CUDA_VISIBLE_DEVICES": "MIG-GPU-5f2a9c1e/1/0"}, None),
        (None, {"CUDA_VISIBLE_DEVICES": "0,-1"}, None),
    ],
)
def test_visible_gpu_indices(
    configured: Sequence[int] | None, environ: dict[str, str], expected: tuple[int, ...] | None
) -> None:
    assert visible_gpu_indices(configured, environ) == expected


# --- read_gpus through the fake pynvml ---


def test_read_gpus_from_nvml(fake_nvml: FakeNvml) -> None:
    fake_nvml.set(
        gpus=[
            FakeGpu(free_mib=1000, total_mib=81559, util=95, name="NVIDIA H100"),
            FakeGpu(free_mib=40000, util=5, name="NVIDIA A100", name_as_bytes=True),
        ]
    )
    assert read_gpus() == [
        GpuReading(0, "NVIDIA H100", 1000 * MIB, 81559 * MIB, 95.0),
        GpuReading(1, "NVIDIA A100", 40000 * MIB, 81559 * MIB, 5.0),
    ]
    assert [reading.index for reading in read_gpus([1])] == [1]


def test_state_is_read_on_every_call(fake_nvml: FakeNvml) -> None:
    fake_nvml.set(gpus=[FakeGpu(util=95)])
    assert read_gpus()[0].utilization_percent == 95
    fake_nvml.set(gpus=[FakeGpu(util=3)])
    assert read_gpus()[0].utilization_percent == 3


def test_an_index_nvml_does_not_see(fake_nvml: FakeNvml) -> None:
    fake_nvml.set(gpus=[FakeGpu(), FakeGpu()])
    with pytest.raises(GpusUnavailable) as raised:
        read_gpus([1, 3])
    assert raised.value.reason == "no GPU with index 3; NVML sees 2 GPU(s)"


def test_a_driver_error_makes_gpus_unavailable(fake_nvml: FakeNvml) -> None:
    fake_nvml.set_error("driver_not_loaded")
    with pytest.raises(GpusUnavailable) as raised:
        read_gpus()
    assert raised.value.reason == "NVML: Driver Not Loaded"


def test_nvml_initialises_again_after_a_failure(fake_nvml: FakeNvml) -> None:
    fake_nvml.set(gpus=[FakeGpu(util=1)])
    assert len(read_gpus()) == 1
    fake_nvml.set_error("gpu_is_lost")
    with pytest.raises(GpusUnavailable, match="GPU is lost"):
        read_gpus()
    fake_nvml.set(gpus=[FakeGpu(util=2), FakeGpu(util=3)])
    assert [reading.utilization_percent for reading in read_gpus()] == [2, 3]


def test_nvml_is_initialised_once(fake_nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.fakes import pynvml as fake_pynvml

    fake_nvml.set(gpus=[FakeGpu()])
    monkeypatch.setattr(resources, "_nvml_ready", None)
    before = fake_pynvml._initialised
    for _ in range(3):
        read_gpus()
    assert fake_pynvml._initialised == before + 1


def test_probe_with_the_fake_reports_a_busy_gpu(fake_nvml: FakeNvml) -> None:
    fake_nvml.set(gpus=[FakeGpu(util=10), FakeGpu(util=95)])
    probe = ResourceProbe(Thresholds(max_gpu_utilization_percent=80), uses_gpu=True, gpu_indices=None)
    assert probe.check().unmet == ("gpu 1: utilization 95% > max_gpu_utilization 80%",)
    only_first = ResourceProbe(Thresholds(max_gpu_utilization_percent=80), uses_gpu=True, gpu_indices=[0])
    assert only_first.check().met


# --- the real pynvml and psutil ---


@pytest.mark.skipif(
    DRIVER, reason="an NVIDIA driver is installed: test_real_nvml_reads_the_gpus runs instead"
)
def test_real_nvml_without_a_driver_is_unavailable() -> None:
    with pytest.raises(GpusUnavailable) as raised:
        read_gpus()
    assert raised.value.reason.startswith("NVML: ")


@pytest.mark.skipif(DRIVER, reason="an NVIDIA driver is installed")
def test_real_nvml_without_a_driver_leaves_gpu_thresholds_not_applicable() -> None:
    thresholds = Thresholds(min_gpu_free_bytes=parse_memory("20GiB"), max_gpu_utilization_percent=80)
    check = ResourceProbe(thresholds, uses_gpu=True, gpu_indices=None).check()
    assert check.met
    assert [line.split(":")[0] for line in check.not_applicable] == [
        "min_gpu_free_memory",
        "max_gpu_utilization",
    ]
    assert all("not applicable (no NVIDIA GPU: NVML: " in line for line in check.not_applicable)


@pytest.mark.skipif(not DRIVER, reason="no NVIDIA driver on this machine")
def test_real_nvml_reads_the_gpus() -> None:
    readings = read_gpus()
    assert readings, "the driver is installed but NVML sees no GPU"
    for index, reading in enumerate(readings):
        assert reading.index == index
        assert reading.name
        assert 0 <= reading.free_bytes <= reading.total_bytes
        assert 0 <= reading.utilization_percent <= 100
    assert read_gpus([0])[0].total_bytes == readings[0].total_bytes


def test_read_host_agrees_with_psutil() -> None:
    reading = read_host()
    memory = psutil.virtual_memory()
    assert reading.total_bytes == memory.total
    assert 0 < reading.available_bytes <= reading.total_bytes
    # Other processes allocate meanwhile; a tenth of the memory is a generous bound.
    assert abs(reading.available_bytes - memory.available) < memory.total / 10


def test_probe_with_an_absurd_host_threshold_is_unmet() -> None:
    probe = ResourceProbe(
        Thresholds(min_host_free_bytes=parse_memory("1000TiB")), uses_gpu=False, gpu_indices=None
    )
    check = probe.check()
    assert not check.met
    assert len(check.unmet) == 1
    assert check.unmet[0].startswith("host: available memory ")
    assert check.unmet[0].endswith(" < min_host_free_memory 1000.0 TiB")


# --- ResourceProbe: what it reads and what it logs ---


def _no_gpu_read(indices: Sequence[int] | None) -> list[GpuReading]:
    raise AssertionError("NVML was asked though no GPU threshold applies")


def _no_host_read() -> HostReading:
    raise AssertionError("psutil was asked though no host threshold is set")


def test_probe_reads_only_what_the_thresholds_need() -> None:
    gpu_only = Thresholds(max_gpu_utilization_percent=parse_percent("80%"))
    cpu_job = ResourceProbe(
        gpu_only, uses_gpu=False, gpu_indices=None, read_gpus=_no_gpu_read, read_host=_no_host_read
    )
    assert cpu_job.check().met
    host_only = Thresholds(min_host_free_bytes=GIB)
    gpu_job = ResourceProbe(
        host_only, uses_gpu=True, gpu_indices=None, read_gpus=_no_gpu_read, read_host=host
    )
    assert gpu_job.check() == Check(unmet=(), not_applicable=())


def test_probe_passes_the_gpu_indices() -> None:
    asked: list[Sequence[int] | None] = []

    def read(indices: Sequence[int] | None) -> list[GpuReading]:
        asked.append(indices)
        return [gpu(i) for i in indices or ()]

    ResourceProbe(ALL, uses_gpu=True, gpu_indices=[2, 3], read_gpus=read, read_host=host).check()
    assert asked == [(2, 3)]


def test_psutil_failures_propagate() -> None:
    def broken() -> HostReading:
        raise OSError("/proc/meminfo unreadable")

    probe = ResourceProbe(ALL, uses_gpu=False, gpu_indices=None, read_host=broken)
    with pytest.raises(OSError, match="meminfo"):
        probe.check()


def test_probe_logs_each_not_applicable_reason_once() -> None:
    reason = GpusUnavailable("NVML: Driver Not Loaded")

    def unavailable(indices: Sequence[int] | None) -> list[GpuReading]:
        raise reason

    probe = ResourceProbe(
        Thresholds(min_gpu_free_bytes=GIB), uses_gpu=True, gpu_indices=None, read_gpus=unavailable
    )
    with structlog.testing.capture_logs() as logs:
        checks = [probe.check() for _ in range(3)]
        reason = GpusUnavailable("NVML: GPU is lost")
        checks.append(probe.check())
        checks.append(probe.check())
    assert all(check.met for check in checks)
    events = [entry for entry in logs if entry["event"] == "resources.not_applicable"]
    assert [entry["detail"] for entry in events] == [
        "min_gpu_free_memory: not applicable (no NVIDIA GPU: NVML: Driver Not Loaded)",
        "min_gpu_free_memory: not applicable (no NVIDIA GPU: NVML: GPU is lost)",
    ]
    assert all(entry["log_level"] == "warning" for entry in events)
