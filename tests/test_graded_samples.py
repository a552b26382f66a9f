"""From generations to graded samples: failed samples left out of the metrics but kept and reported."""

from __future__ import annotations

import pytest

from inference.dataset import Item
from inference.errors import TaskInvalid
from inference.excerpt import CUT_MARKER
from inference.generation import Generation
from inference.grading import Grade
from inference.rewards import RewardFailed
from inference.samples import SampleLimits, builtin_scorer, grade_samples

ITEMS = [Item("a", "1+1", "2"), Item("b", "2+2", "4"), Item("c", "3+3", "6")]
PROMPTS = [f"{item.prompt}=" for item in ITEMS]


def generations(*texts: str) -> list[Generation]:
    return [
        Generation(text=text, tokens=len(text), truncated=False, entropy_sum=1.0, entropy_tokens=2)
        for text in texts
    ]


def picky(prompt: str, response: str, reference: str, graded: Grade) -> float:
    if prompt == "2+2":
        raise RewardFailed("raised ValueError: no fours")
    return 0.5 if graded.correct else -0.5


def test_every_sample_is_graded_and_rewarded_in_order() -> None:
    graded = grade_samples(
        "t",
        ITEMS,
        PROMPTS,
        generations("\\boxed{2}", "\\boxed{5}", "\\boxed{6}"),
        SampleLimits(1, 10, 100),
        builtin_scorer,
    )

    assert [(r.group, r.correct, r.reward, r.answer) for r in graded.records] == [
        (0, True, 1.0, "2"),
        (1, False, 0.0, "5"),
        (2, True, 1.0, "6"),
    ]
    assert [(o.index, o.prompt_id, o.prompt, o.correct, o.reward, o.entropy) for o in graded.outputs] == [
        (0, "a", "1+1=", True, 1.0, 0.5),
        (1, "b", "2+2=", False, 0.0, 0.5),
        (2, "c", "3+3=", True, 1.0, 0.5),
    ]
    assert graded.problems == ()


def test_a_failed_reward_leaves_the_sample_out_and_reports_it() -> None:
    # Two completions per prompt: samples 2 and 3 belong to prompt "b".
    texts = ("\\boxed{2}", "\\boxed{3}", "\\boxed{4}", "\\boxed{4}", "\\boxed{6}", "\\boxed{7}")

    graded = grade_samples("t", ITEMS, PROMPTS, generations(*texts), SampleLimits(2, 1, 100), picky)

    assert [(r.group, r.reward) for r in graded.records] == [(0, 0.5), (0, -0.5), (2, 0.5), (2, -0.5)]
    assert [(p.where, p.prompt_id, p.index, p.message) for p in graded.problems] == [
        ("sample 2", "b", 2, "reward raised ValueError: no fours"),
        ("sample 3", "b", 3, "reward raised ValueError: no fours"),
    ]
    # The cap keeps the first samples, and failed ones beyond it, up to as many again.
    assert [(o.index, o.error) for o in graded.outputs] == [
        (0, None),
        (2, "reward raised ValueError: no fours"),
    ]
    assert graded.outputs[1].reward is None
    wider = grade_samples("t", ITEMS, PROMPTS, generations(*texts), SampleLimits(2, 2, 100), picky)
    assert [(o.index, o.error is None) for o in wider.outputs] == [
        (0, True),
        (1, True),
        (2, False),
        (3, False),
    ]


def test_without_a_scorer_there_is_no_reward() -> None:
    graded = grade_samples(
        "t", ITEMS[:1], PROMPTS[:1], generations("\\boxed{2}"), SampleLimits(1, 10, 100), None
    )

    assert graded.records[0].reward is None
    assert graded.outputs[0].reward is None


def test_long_text_is_cut_and_marked() -> None:
    graded = grade_samples("t", ITEMS[:1], PROMPTS[:1], generations("x" * 500), SampleLimits(1, 10, 32), None)

    assert len(graded.outputs[0].response) == 32
    assert graded.outputs[0].response.endswith(CUT_MARKER)
    assert graded.records[0].response == "x" * 500


def test_a_reward_that_fails_on_every_sample_fails_the_job() -> None:
    def broken(prompt: str, response: str, reference: str, graded: Grade) -> float:
        raise RewardFailed("raised RuntimeError: broken reward")

    with pytest.raises(
        TaskInvalid, match=r"task 't': the reward failed on 3 samples \(every one\), .*sample 0: "
    ):
        grade_samples("t", ITEMS, PROMPTS, generations("1", "2", "3"), SampleLimits(1, 10, 100), broken)
    # A reward that fails from the start is not tried on every sample (each may cost its time limit).
    calls: list[str] = []

    def counted(prompt: str, response: str, reference: str, graded: Grade) -> float:
        calls.append(response)
        raise RewardFailed("took longer than 10 s (reward_timeout_s) and was stopped")

    items = [Item(str(i), f"{i}+0", str(i)) for i in range(50)]
    prompts = [item.prompt for item in items]
    with pytest.raises(TaskInvalid, match=r"the reward failed on 10 samples in a row, with none scored"):
        grade_samples("t", items, prompts, generations(*("x" * 50)), SampleLimits(1, 5, 100), counted)
    assert len(calls) == 10
