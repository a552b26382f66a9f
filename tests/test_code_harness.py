"""lm-eval's own humaneval and mbpp utils, imported as lm-eval imports them, judged in evald's sandbox:
no ``HF_ALLOW_CODE_EVAL``, no Hub script, and the model's code kept from the host."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from inference.code.harness import sandboxed_code_eval
from inference.spec import CodeLimits, CodeSpec

lm_eval = pytest.importorskip("lm_eval")
TASKS = Path(lm_eval.__file__).parent / "tasks"
SPEC = CodeSpec(parallel=2, limits=CodeLimits(cpu_s=1, wall_s=4, memory_mb=256))


def task_utils(folder: str) -> ModuleType:
    """A task's ``utils.py`` loaded from its file, as lm-eval's ``!function`` does."""
    spec = importlib.util.spec_from_file_location(f"evald_test_{folder}_utils", TASKS / folder / "utils.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_humaneval_and_mbpp_metrics_run_in_the_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_ALLOW_CODE_EVAL", raising=False)
    reference = "def check(candidate):\n    assert candidate(2, 3) == 5\ncheck(add)"
    candidates = [
        "def add(a, b):\n    return a + b",
        "def add(a, b):\n    return a * b",
        f"def add(a, b):\n    open({str(Path(__file__))!r}).read()\n    return a + b",
    ]
    with sandboxed_code_eval("lm-eval", SPEC):
        humaneval = task_utils("humaneval")
        scores = humaneval.pass_at_k(references=[reference], predictions=[candidates], k=[1, 2, 3])
        mbpp = task_utils("mbpp")
        # As lm-eval calls it per document: the gold test and the filtered response.
        right = mbpp.pass_at_1(["assert add(2, 3) == 5"], ["def add(a, b):\n    return a + b"])
        wrong = mbpp.pass_at_1(["assert add(2, 3) == 5"], ["def add(a, b):\n    return a - b"])
        compute = humaneval.compute_.compute
        _, results = compute(references=[reference], predictions=[candidates[2:]], k=[1])
    assert scores == pytest.approx({"pass@1": 1 / 3, "pass@2": 2 / 3, "pass@3": 1.0})
    assert (right, wrong) == (1.0, 0.0)
    assert results[0][0][1]["result"] == "failed: runtime_error"  # the host's files are out of its reach
    import evaluate

    assert evaluate.load.__name__ == "load"  # unwrapped once the job is done


def test_its_pass_at_k_is_the_metrics_estimator() -> None:
    from inference.code.harness import pass_at_k as exact
    from inference.metrics.passk import pass_at_k

    for n in range(1, 12):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert exact(n, c, k) == pytest.approx(pass_at_k(n, c, k), abs=1e-12)
