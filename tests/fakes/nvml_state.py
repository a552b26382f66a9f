"""Drive the fake ``pynvml`` (``tests/fakes/pynvml.py``): write its state file and install it.

In the test process::

    nvml = FakeNvml.install(tmp_path, monkeypatch)
    nvml.set(gpus=[FakeGpu(free_mib=1000, util=95)])

For a daemon subprocess, start it with ``nvml.subprocess_env(os.environ)``; later ``set`` calls are seen
by its next NVML call.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

from tests.fakes import pynvml as fake_pynvml

#: The folder to put first on PYTHONPATH so that ``import pynvml`` finds the fake.
FAKES_DIR = Path(__file__).resolve().parent
H100_TOTAL_MIB = 81559


@dataclass(frozen=True)
class FakeGpu:
    free_mib: float = H100_TOTAL_MIB
    total_mib: float = H100_TOTAL_MIB
    util: int = 0
    name: str = "NVIDIA H100 80GB HBM3"
    #: Return the name as bytes, as nvidia-ml-py releases before 11.515 did.
    name_as_bytes: bool = False


class FakeNvml:
    def __init__(self, state_file: Path) -> None:
        self.state_file = state_file

    @classmethod
    def install(cls, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
        """Make ``import pynvml`` in this process return the fake, with no GPUs until ``set``."""
        nvml = cls(tmp_path / "fake_nvml.json")
        nvml.set(gpus=[])
        monkeypatch.setenv(fake_pynvml.STATE_ENV, str(nvml.state_file))
        monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml)
        return nvml

    def set(self, *, gpus: Sequence[FakeGpu]) -> None:
        """The GPUs NVML sees from now on, index 0 first."""
        self._write({"gpus": [asdict(gpu) for gpu in gpus]})

    def set_error(self, error: str = "driver_not_loaded") -> None:
        """Every NVML call from now on raises this error (a key of ``fake_pynvml.ERRORS``)."""
        if error not in fake_pynvml.ERRORS:
            raise ValueError(f"unknown fake NVML error {error!r}; known: {', '.join(fake_pynvml.ERRORS)}")
        self._write({"error": error})

    def subprocess_env(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` plus what makes a child process import the fake pynvml and read this state."""
        path = os.pathsep.join(p for p in (str(FAKES_DIR), base.get("PYTHONPATH", "")) if p)
        return {**base, "PYTHONPATH": path, fake_pynvml.STATE_ENV: str(self.state_file)}

    def _write(self, state: dict[str, object]) -> None:
        # Replace rather than rewrite: a reader in another process never sees half a file.
        partial = self.state_file.with_suffix(".partial")
        partial.write_text(json.dumps(state), encoding="utf-8")
        partial.replace(self.state_file)
