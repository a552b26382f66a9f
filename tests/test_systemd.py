"""Every unit in systemd/ passes systemd's own checker and stays hardened.

Skipped only where systemd-analyze is absent. The daemon's units (``evald ... run``) must also keep what
the evaluation workers and operators rely on: GPUs reachable, SIGHUP reload, no setting that breaks the
torch/Triton JIT or psutil.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

UNITS = Path(__file__).resolve().parent.parent / "systemd"
UNIT_SUFFIXES = {".service", ".socket", ".timer", ".path", ".target"}
UNIT_FILES = sorted(path.name for path in UNITS.iterdir() if path.suffix in UNIT_SUFFIXES)
SERVICES = [name for name in UNIT_FILES if name.endswith(".service")]
INSTALLED = "/opt/evald/.venv/bin/evald"
#: `systemd-analyze security --offline=true`: 0 is locked down, 10 wide open; the issue asks for <= 3.0.
MAX_EXPOSURE = 3.0
#: /proc/devices groups the NVIDIA driver registers: nvidia (or nvidia-frontend on older drivers) for
#: /dev/nvidia0..N and /dev/nvidiactl, nvidia-uvm for /dev/nvidia-uvm(-tools), nvidia-caps for MIG.
NVIDIA_GROUPS = ("nvidia", "nvidia-frontend", "nvidia-uvm", "nvidia-caps")
OVERALL = re.compile(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)")

pytestmark = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed"
)


def unit_settings(text: str) -> dict[str, list[str]]:
    """``Section.Key`` -> every value it is given, in order (systemd keys may repeat)."""
    settings: dict[str, list[str]] = defaultdict(list)
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, _, value = line.partition("=")
        settings[f"{section}.{key.strip()}"].append(value.strip())
    return settings


def is_daemon(settings: dict[str, list[str]]) -> bool:
    return any(command.split()[-1:] == ["run"] for command in settings["Service.ExecStart"])


def exposure(path: Path) -> tuple[float, list[str]]:
    """The overall exposure and the settings that cost the most, worst first."""
    text = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", "--no-pager", str(path)],
        capture_output=True,
        text=True,
    )
    found = OVERALL.search(text.stdout)
    assert found, f"no overall exposure in systemd-analyze's output:\n{text.stdout}{text.stderr}"
    listed = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", "--json=short", str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    costs = [
        (float(item["exposure"]), f"{item['name']} ({item['description']}): {item['exposure']}")
        for item in json.loads(listed.stdout)
        if not item["set"] and item["exposure"] is not None
    ]
    return float(found.group(1)), [line for _, line in sorted(costs, key=lambda cost: -cost[0])]


def test_units_are_found() -> None:
    assert "evald.service" in SERVICES and "evald@.service" in SERVICES, UNIT_FILES


@pytest.mark.parametrize("unit", UNIT_FILES)
def test_unit_verifies(unit: str, tmp_path: Path) -> None:
    text = (UNITS / unit).read_text()
    # verify checks that ExecStart exists: point it at this checkout's evald instead of /opt.
    evald = Path(sys.executable).parent / "evald"
    assert evald.exists(), "evald is not installed in this environment"
    name = unit.replace("@.", "@test.")
    (tmp_path / name).write_text(text.replace(INSTALLED, str(evald)))
    checked = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / name)], capture_output=True, text=True
    )
    problems = [
        line for line in (checked.stdout + checked.stderr).splitlines() if name in line or "evald" in line
    ]
    assert checked.returncode == 0 and problems == [], checked.stdout + checked.stderr


@pytest.mark.parametrize("unit", SERVICES)
def test_unit_exposure_is_at_most_3(unit: str) -> None:
    score, worst = exposure(UNITS / unit)
    assert score <= MAX_EXPOSURE, (
        f"{unit}: exposure {score} > {MAX_EXPOSURE}; the costliest settings:\n  " + "\n  ".join(worst[:10])
    )


def test_exposure_check_catches_an_open_unit(tmp_path: Path) -> None:
    # The check must be able to fail: a unit with no sandbox at all scores far above the bound.
    (tmp_path / "open.service").write_text("[Service]\nExecStart=/bin/true\n")
    score, worst = exposure(tmp_path / "open.service")
    assert score > MAX_EXPOSURE
    assert any(line.startswith("PrivateNetwork=") for line in worst), worst


@pytest.mark.parametrize("unit", SERVICES)
def test_daemon_unit_keeps_gpus_reload_and_jit(unit: str) -> None:
    settings = unit_settings((UNITS / unit).read_text())
    if not is_daemon(settings):
        pytest.skip(f"{unit} does not run the daemon")
    service: dict[str, list[str]] = defaultdict(list)
    service.update((key.removeprefix("Service."), values) for key, values in settings.items())
    assert service["Type"] == ["notify"] and service["Restart"] == ["on-failure"] and service["WatchdogSec"]
    assert service["ExecReload"] == ["/bin/kill -HUP $MAINPID"], service["ExecReload"]
    assert service["KillMode"] == ["mixed"]

    # Evaluation workers reach every NVIDIA device group, read and write.
    allowed = [value.split() for value in service["DeviceAllow"]]
    for group in NVIDIA_GROUPS:
        assert any(
            spec.startswith("char-")
            and fnmatch.fnmatch(group, spec[len("char-") :])
            and set("rw") <= set(mode)
            for spec, mode in allowed
        ), f"{unit}: DeviceAllow= does not let the workers open the {group} devices: {allowed}"
    # closed still allows /dev/null, /dev/urandom, ...; PrivateDevices= would hide /dev/nvidia*.
    assert service["DevicePolicy"] == ["closed"], service["DevicePolicy"]
    assert service.get("PrivateDevices", ["no"]) == ["no"], "PrivateDevices= hides the GPUs"
    # torch's oneDNN, Triton and DeepSpeed JIT need W+X memory; psutil reads /proc/meminfo and /proc/stat.
    assert service.get("MemoryDenyWriteExecute", ["no"]) == ["no"], "MemoryDenyWriteExecute= breaks the JIT"
    assert service.get("ProcSubset", ["all"]) == ["all"], "ProcSubset=pid hides /proc/meminfo and /proc/stat"
    # gloo/NCCL/torchrun TCP, the database, webhooks, and getifaddrs() over netlink.
    assert service["RestrictAddressFamilies"] == ["AF_UNIX AF_INET AF_INET6 AF_NETLINK"]
    assert service["SystemCallFilter"][0] == "@system-service"
    assert service["SystemCallErrorNumber"] == ["EPERM"], "a filtered call must fail, not kill a rank"

    # Writable: the state and cache directories only; checkpoint roots stay read-only.
    assert service["ProtectSystem"] == ["strict"] and service["ProtectHome"] == ["yes"]
    assert service["StateDirectory"] and service["CacheDirectory"]
    assert service["ReadWritePaths"] == [], "only StateDirectory=/CacheDirectory= are writable as shipped"
    assert service["CapabilityBoundingSet"] == [""] and service["AmbientCapabilities"] == [""]


def _allowed_calls(values: list[str]) -> set[str]:
    """The names an allow-list ``SystemCallFilter=`` adds (groups as written), less any ``~`` line's."""
    allowed: set[str] = set()
    for value in values:
        if not value:
            allowed = set()
        elif value.startswith("~"):
            allowed -= set(value[1:].split())
        else:
            allowed |= set(value.split())
    return allowed


@pytest.mark.parametrize("unit", SERVICES)
def test_daemon_unit_lets_cuda_share_memory_and_reach_mps(unit: str) -> None:
    settings = unit_settings((UNITS / unit).read_text())
    if not is_daemon(settings):
        pytest.skip(f"{unit} does not run the daemon")
    calls = _allowed_calls(settings["Service.SystemCallFilter"])
    # CUDA IPC (torch's expandable segments, NCCL's cuMem) copies another rank's fd with pidfd_getfd,
    # which @system-service leaves out; ptrace (py-spy inside the sandbox) stays a drop-in's choice.
    assert {"@system-service", "pidfd_getfd"} <= calls and "ptrace" not in calls and "@debug" not in calls
    # /tmp stays private, and the MPS server's pipes are bound into it when they exist.
    assert settings["Service.PrivateTmp"] == ["yes"]
    assert "-/tmp/nvidia-mps" in settings["Service.BindPaths"], settings["Service.BindPaths"]


#: The systemd how-to's drop-ins (docs/how-to/systemd.md) for CUDA MPS and for py-spy inside the sandbox:
#: each keeps the units <= 3.0.
DROP_INS = {
    "mps": "[Unit]\nAfter=nvidia-mps.service\n[Service]\nUser=trainer\nGroup=trainer\nRemoveIPC=no\n",
    "py-spy": (
        "[Service]\nSystemCallFilter=ptrace\nCapabilityBoundingSet=CAP_SYS_PTRACE\n"
        "AmbientCapabilities=CAP_SYS_PTRACE\n"
    ),
}


@pytest.mark.parametrize("drop_in", sorted(DROP_INS))
@pytest.mark.parametrize("unit", ["evald.service", "evald@.service"])
def test_the_documented_drop_ins_keep_the_score(unit: str, drop_in: str, tmp_path: Path) -> None:
    text = DROP_INS[drop_in]
    howto = (UNITS.parent / "docs" / "how-to" / "systemd.md").read_text()
    assert f"```ini\n{text}```" in howto, (
        f"docs/how-to/systemd.md does not show the {drop_in} drop-in as tested"
    )
    # A drop-in's settings apply as if appended to the unit (systemd-analyze --offline reads no drop-ins).
    name = unit.replace("@.", "@test.")
    (tmp_path / name).write_text((UNITS / unit).read_text() + "\n" + text)
    score, worst = exposure(tmp_path / name)
    assert score <= MAX_EXPOSURE, f"{unit} + {drop_in}: {score}; " + "; ".join(worst[:5])
