"""Every metric of the registry on hand-made records, against values worked out by hand."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
import sacrebleu

from inference.errors import TaskInvalid
from inference.metrics import (
    DEFAULT_METRICS,
    METRICS,
    DocumentRecord,
    EvalRecord,
    SampleRecord,
    compute_metrics,
    higher_is_better,
    resolve_metrics,
)
from inference.spec import MetricValue, TaskKind


def record(*samples: tuple[bool, int, bool], generation_s: float = 2.0) -> EvalRecord:
    return EvalRecord(
        samples=tuple(
            SampleRecord(correct=c, tokens=t, truncated=tr, group=i) for i, (c, t, tr) in enumerate(samples)
        ),
        generation_s=generation_s,
        load_s=1.5,
        wall_s=4.0,
    )


RUN = record((True, 10, False), (False, 12, False), (True, 11, False), (False, 32, True))


def computed(name: str, run: EvalRecord = RUN, *, n_samples: int = 8) -> tuple[MetricValue, ...]:
    """What a job would report for ``name``: one value, or none when it was computed over nothing."""
    kind: TaskKind = "likelihood" if run.documents else "generate"
    return compute_metrics(resolve_metrics([name], kind=kind, n_samples=n_samples), run)


def value(name: str, run: EvalRecord = RUN, *, n_samples: int = 8) -> MetricValue:
    (result,) = computed(name, run, n_samples=n_samples)
    return result


def sampled(groups: Sequence[Sequence[tuple[bool, float | None]]]) -> EvalRecord:
    """Completions per prompt: (correct, reward)."""
    return EvalRecord(
        samples=tuple(
            SampleRecord(correct=c, tokens=5, truncated=False, group=g, reward=r, answer=str(int(c)))
            for g, completions in enumerate(groups)
            for c, r in completions
        )
    )


def test_accuracy_is_a_proportion_with_binomial_stderr() -> None:
    # Agresti–Coull: (2 + 2) / (4 + 4) = 0.5, so sqrt(0.25 / 8).
    assert value("accuracy") == MetricValue(name="accuracy", value=0.5, n=4, stderr=math.sqrt(0.25 / 8))


def test_response_length_mean_and_sample_stderr() -> None:
    result = value("response_length")

    # tokens 10, 12, 11, 32: mean 16.25, sample variance 109.5833…
    assert result.value == pytest.approx(16.25)
    assert result.n == 4
    assert result.stderr == pytest.approx(math.sqrt((6.25**2 + 4.25**2 + 5.25**2 + 15.75**2) / 3 / 4))


def test_response_length_of_correct_and_incorrect_answers() -> None:
    correct = value("response_length_correct")
    incorrect = value("response_length_incorrect")

    assert (correct.value, correct.n) == (10.5, 2)
    assert correct.stderr == pytest.approx(math.sqrt(0.5 / 2))
    assert (incorrect.value, incorrect.n) == (22.0, 2)
    # Every answer correct: no wrong answer to measure, so no number (not a mean of 0 over n = 0).
    assert is_no_samples(
        computed("response_length_incorrect", record((True, 3, False))), "response_length_incorrect"
    )


def test_truncation_rate() -> None:
    result = value("truncation_rate")

    assert (result.value, result.n) == (0.25, 4)
    # 1 of 4: q = 3 / 8.
    assert result.stderr == pytest.approx(math.sqrt(3 / 8 * 5 / 8 / 8))


def test_one_sample_has_no_sample_stderr() -> None:
    assert value("response_length", record((True, 7, False))).stderr is None


def test_timing_metrics() -> None:
    assert value("tokens_per_s") == MetricValue(name="tokens_per_s", value=65 / 2.0, n=4, stderr=None)
    assert value("wall_s") == MetricValue(name="wall_s", value=4.0, n=None, stderr=None)
    assert value("load_s") == MetricValue(name="load_s", value=1.5, n=None, stderr=None)
    # No time in the model: no rate (0 tokens/s would be a fake collapse).
    assert computed("tokens_per_s", record((True, 3, False), generation_s=0.0)) == ()


def test_batch_latency_percentiles_and_peak_memory() -> None:
    run = EvalRecord(batch_latencies_s=(1.0, 2.0, 3.0, 4.0, 10.0), peak_memory_mb=812.5)

    assert value("latency_p50_s", run) == MetricValue(name="latency_p50_s", value=3.0, n=5)
    # Position 0.95 * 4 = 3.8 between 4 and 10: 4 + 0.8 * 6.
    assert value("latency_p95_s", run).value == pytest.approx(8.8)
    assert computed("latency_p95_s", EvalRecord()) == ()
    assert value("peak_memory_mb", run) == MetricValue(name="peak_memory_mb", value=812.5)
    # Not measured: absent, not 0 MiB.
    assert computed("peak_memory_mb", EvalRecord(batch_latencies_s=(1.0,))) == ()


EMPTY_SENSITIVE = (
    "accuracy",
    "response_length",
    "response_length_correct",
    "reward",
    "reward_std",
    "reward_p50",
    "entropy",
    "pass@2",
    "maj@2",
    "group_reward_std",
    "group_zero_spread",
    "truncation_rate",
    "bleu",
    "exact_match",
)


def is_no_samples(values: tuple[MetricValue, ...], name: str) -> bool:
    return len(values) == 1 and values[0].name == name and values[0].n == 0 and math.isnan(values[0].value)


@pytest.mark.parametrize("name", EMPTY_SENSITIVE)
def test_a_metric_over_no_samples_says_so_never_a_number(name: str) -> None:
    """Issue 20: ``response_length_correct`` was stored as 0 with n = 0 when no answer was correct (a fake
    cliff on every chart). Issue 31: then it vanished without a word. Computed over nothing, a metric is
    kept as n = 0 with no number (NaN), which every surface shows as "no samples"."""
    found = computed(name, record())

    assert is_no_samples(found, name), found
    assert found[0].stderr is None


@pytest.mark.parametrize("name", ["tokens_per_s", "latency_p50_s", "peak_memory_mb"])
def test_a_timing_that_was_not_measured_is_absent(name: str) -> None:
    """A rate over no time or a memory figure the device cannot give is not news about the checkpoint."""
    assert computed(name, record()) == ()


def test_likelihood_metrics_over_no_scored_tokens_say_no_samples() -> None:
    nothing = EvalRecord(documents=(DocumentRecord(nll=0.0, tokens=0, words=0, bytes=0),))
    for name in ("perplexity", "nll", "word_perplexity", "byte_perplexity", "bits_per_byte"):
        assert is_no_samples(computed(name, nothing), name), name


def test_the_metrics_that_have_samples_are_kept_beside_the_empty_ones() -> None:
    every_correct = record((True, 4, False), (True, 6, False))
    names = ["accuracy", "response_length_correct", "response_length_incorrect", "tokens_per_s"]

    found = compute_metrics(resolve_metrics(names), every_correct)

    assert [m.name for m in found] == [
        "accuracy",
        "response_length_correct",
        "response_length_incorrect",
        "tokens_per_s",
    ]
    assert found[1] == MetricValue(name="response_length_correct", value=5.0, n=2, stderr=1.0)
    assert found[2].n == 0 and math.isnan(found[2].value)


def test_pass_at_k_averages_the_unbiased_estimator_over_prompts() -> None:
    run = sampled([[(True, 1.0)] * 2 + [(False, 0.0)] * 3, [(False, 0.0)] * 5])

    assert value("pass@1", run).value == pytest.approx(0.2)
    two = value("pass@2", run)
    # Prompt 0: 1 - C(3,2)/C(5,2) = 0.7; prompt 1: 0.
    assert two.value == pytest.approx(0.35)
    assert two.n == 2
    assert two.stderr == pytest.approx(0.35)
    assert value("pass@5", run).value == pytest.approx(0.5)


def test_pass_at_k_skips_prompts_left_with_fewer_than_k_completions() -> None:
    # Prompt 1 lost two of its three completions (their rewards failed).
    run = sampled([[(True, 1.0), (False, 0.0), (False, 0.0)], [(True, 1.0)]])

    result = value("pass@2", run)

    assert result.value == pytest.approx(1 - 1 / 3)
    assert result.n == 1


def test_majority_at_k() -> None:
    run = EvalRecord(
        samples=(
            SampleRecord(correct=True, tokens=1, truncated=False, group=0, answer="4"),
            SampleRecord(correct=False, tokens=1, truncated=False, group=0, answer="5"),
            SampleRecord(correct=True, tokens=1, truncated=False, group=0, answer="4"),
            SampleRecord(correct=False, tokens=1, truncated=False, group=1, answer="7"),
            SampleRecord(correct=True, tokens=1, truncated=False, group=1, answer="6"),
            SampleRecord(correct=False, tokens=1, truncated=False, group=1, answer=None),
        )
    )

    # Prompt 0: "4" wins 2 to 1; prompt 1: "7" and "6" tie, so half credit.
    assert value("maj@3", run).value == pytest.approx(0.75)
    # First two only: prompt 0 ties "4"/"5" (0.5), prompt 1 ties "7"/"6" (0.5).
    assert value("maj@2", run).value == pytest.approx(0.5)


def test_exact_match_compares_the_final_answer_as_written() -> None:
    def one(response: str, reference: str) -> float:
        run = EvalRecord(
            samples=(
                SampleRecord(
                    correct=False, tokens=1, truncated=False, group=0, response=response, reference=reference
                ),
            )
        )
        return value("exact_match", run).value

    assert one("23+45=\\boxed{68}", "68") == 1.0
    assert one("so \\boxed{ \\frac{1}{2} } done", "$\\frac{1}{2}$") == 1.0
    assert one("\\boxed{1} then \\boxed{\\{1, 2\\}}", "\\{1,2\\}") == 1.0
    assert one("68", "68") == 1.0
    assert one("\\boxed{0.5}", "\\frac{1}{2}") == 0.0
    assert one("The answer is 68", "68") == 0.0
    assert one("\\boxed{68", "68") == 0.0


def test_reward_mean_and_distribution() -> None:
    run = sampled([[(True, 0.0)], [(True, 1.0)], [(True, 0.5)], [(True, 1.0)]])

    mean = value("reward", run)
    assert (mean.value, mean.n) == (0.625, 4)
    spread = math.sqrt((0.625**2 + 0.375**2 + 0.125**2 + 0.375**2) / 3)
    assert mean.stderr == pytest.approx(spread / 2)
    assert value("reward_std", run).value == pytest.approx(spread)
    # Sorted 0, 0.5, 1, 1: p10 at position 0.3, p50 at 1.5, p90 at 2.7.
    assert value("reward_p10", run).value == pytest.approx(0.15)
    assert value("reward_p50", run).value == pytest.approx(0.75)
    assert value("reward_p90", run).value == pytest.approx(1.0)


def test_grpo_group_statistics() -> None:
    run = sampled(
        [
            [(True, 1.0)] * 4,
            [(True, 1.0), (False, 0.0), (True, 1.0), (False, 0.0)],
            # One completion left: no spread to speak of, so not counted.
            [(True, 1.0)],
        ]
    )

    spread = value("group_reward_std", run)
    assert spread.n == 2
    assert spread.value == pytest.approx(math.sqrt(1 / 3) / 2)
    zero = value("group_zero_spread", run)
    assert (zero.value, zero.n) == (0.5, 2)
    assert zero.stderr == pytest.approx(math.sqrt(0.25 / 6))


def test_entropy_is_token_weighted_with_the_ratio_estimators_stderr() -> None:
    run = EvalRecord(
        samples=(
            SampleRecord(correct=True, tokens=3, truncated=False, group=0, entropy_sum=2.0, entropy_tokens=4),
            SampleRecord(correct=True, tokens=1, truncated=False, group=1, entropy_sum=3.0, entropy_tokens=2),
            SampleRecord(correct=True, tokens=0, truncated=False, group=2),
        )
    )

    result = value("entropy", run)

    assert result.value == pytest.approx(5 / 6)
    assert result.n == 2
    # Residuals 2 - 5/6·4 and 3 - 5/6·2 are both ±4/3: sqrt((16/9 · 2) / 2) / mean tokens 3.
    assert result.stderr == pytest.approx((4 / 3) / 3)


def test_bleu_is_sacrebleus_corpus_bleu() -> None:
    pairs = [
        ("the cat sat on the mat", "the cat sat on the mat"),
        ("a dog ran in the park", "a dog ran to the park"),
    ]
    run = EvalRecord(
        samples=tuple(
            SampleRecord(correct=False, tokens=1, truncated=False, group=i, response=h, reference=r)
            for i, (h, r) in enumerate(pairs)
        )
    )

    result = value("bleu", run)

    expected = sacrebleu.corpus_bleu([h for h, _ in pairs], [[r for _, r in pairs]]).score
    assert result.value == pytest.approx(expected)
    assert (result.n, result.stderr) == (2, None)
    assert 0 < result.value < 100


def test_perplexity_and_nll_are_token_weighted() -> None:
    run = EvalRecord(documents=(DocumentRecord(nll=2.0, tokens=4), DocumentRecord(nll=1.0, tokens=1)))

    nll = value("nll", run)
    perplexity = value("perplexity", run)

    assert nll.value == pytest.approx(0.6)
    assert nll.n == 2
    # Residuals 2 - 0.6·4 = -0.4 and 1 - 0.6 = 0.4: sqrt(0.32 / 2) / mean tokens 2.5.
    assert nll.stderr == pytest.approx(0.4 / 2.5)
    assert perplexity.value == pytest.approx(math.exp(0.6))
    assert perplexity.stderr == pytest.approx(math.exp(0.6) * 0.4 / 2.5)
    assert value("tokens_per_s", EvalRecord(documents=run.documents, generation_s=0.5)).value == 10.0


def test_compute_keeps_the_requested_order() -> None:
    names = ["wall_s", "accuracy", "response_length"]

    assert [m.name for m in compute_metrics(resolve_metrics(names), RUN)] == names


def test_unknown_metric_names_it_and_lists_the_known() -> None:
    known = r"unknown metric 'rouge' \(known: accuracy, bits_per_byte, bleu, "
    with pytest.raises(TaskInvalid, match=known) as caught:
        resolve_metrics(["accuracy", "rouge"])

    assert all(name in str(caught.value) for name in [*METRICS, "pass@K", "maj@K"])
    for bad in ("pass@0", "pass@", "PASS@2", "pass@k", "maj@-1"):
        with pytest.raises(TaskInvalid, match="unknown metric"):
            resolve_metrics([bad])


def test_duplicate_metric() -> None:
    with pytest.raises(TaskInvalid, match="metric 'accuracy' is listed twice"):
        resolve_metrics(["accuracy", "accuracy"])
    with pytest.raises(TaskInvalid, match="metric 'pass@2' is listed twice"):
        resolve_metrics(["pass@2", "pass@2"], n_samples=2)


def test_metrics_must_fit_the_task() -> None:
    with pytest.raises(TaskInvalid, match=r"'pass@4' needs n_samples >= 4 .* the task has n_samples = 2"):
        resolve_metrics(["pass@4"], n_samples=2)
    with pytest.raises(TaskInvalid, match=r"'group_zero_spread' needs n_samples >= 2"):
        resolve_metrics(["group_zero_spread"])
    with pytest.raises(TaskInvalid, match=r"'perplexity' does not apply to a generate task"):
        resolve_metrics(["perplexity"])
    with pytest.raises(
        TaskInvalid, match=r"'accuracy' does not apply to a likelihood task \(those that do: "
    ):
        resolve_metrics(["accuracy"], kind="likelihood")
    for kind, names in DEFAULT_METRICS.items():
        assert [m.name for m in resolve_metrics(names, kind=kind)] == list(names)


def test_every_name_is_lower_case_and_has_a_direction_or_none() -> None:
    assert all(name == name.lower() and " " not in name for name in METRICS)
    assert higher_is_better("pass@16") is True
    assert higher_is_better("perplexity") is False
    assert higher_is_better("response_length") is None
    assert higher_is_better("no_such_metric") is None


def test_completions_of_one_prompt_are_not_independent_draws() -> None:
    # Two prompts, two completions each: one solved twice, one failed twice.
    run = sampled([[(True, 1.0), (True, 1.0)], [(False, 0.0), (False, 0.0)]])

    accuracy = value("accuracy", run)
    length = value("response_length", run)

    # Per prompt sums 2 and 0 of 2 each, ratio 0.5: sqrt(((2 - 1)² + (0 - 1)²) / (2 · 1)) / 2 = 0.5, where
    # the binomial error over 4 independent samples would claim 0.25.
    assert (accuracy.value, accuracy.n) == (0.5, 4)
    assert accuracy.stderr == pytest.approx(0.5)
    assert (length.value, length.n, length.stderr) == (5.0, 4, 0.0)
    assert value("reward", run).stderr == pytest.approx(0.5)


def test_a_proportion_at_zero_or_one_still_has_noise() -> None:
    none = value("truncation_rate", record(*[(True, 5, False)] * 500))
    every = value("accuracy", record(*[(True, 5, False)] * 500))

    assert (none.value, every.value) == (0.0, 1.0)
    # q = 2 / 504: a first truncated answer is not an infinitely significant change.
    assert none.stderr == pytest.approx(math.sqrt(2 / 504 * 502 / 504 / 504))
    assert every.stderr == pytest.approx(none.stderr)


def test_one_rule_per_kind_a_0_1_reward_is_a_proportion_like_accuracy() -> None:
    """Issue 20: ``accuracy`` and ``reward`` of the same 0/1 grade had standard errors 0.01347 and 0 at
    1.0 (Agresti–Coull against the sample std). A mean of 0/1 values is a proportion: one rule."""
    for grades in ([True] * 500, [True, False, True, True, False] * 20, [False] * 50):
        run = sampled([[(c, float(c))] for c in grades])
        accuracy, reward, pass1 = (
            value("accuracy", run),
            value("reward", run),
            value("pass@1", run, n_samples=1),
        )
        assert reward == accuracy.model_copy(update={"name": "reward"})
        assert pass1 == accuracy.model_copy(update={"name": "pass@1"})
    every = value("reward", sampled([[(True, 1.0)]] * 500))
    assert every.stderr == pytest.approx(math.sqrt(502 / 504 * 2 / 504 / 504))


def test_a_graded_reward_keeps_the_mean_rule() -> None:
    run = sampled([[(True, 0.0)], [(True, 0.5)], [(True, 1.0)]])
    assert value("reward", run).stderr == pytest.approx(0.5 / math.sqrt(3))


def test_a_clustered_proportion_at_one_keeps_the_agresti_coull_floor() -> None:
    # Every completion of every prompt correct: the clustered error alone would be 0.
    run = sampled([[(True, 1.0)] * 4] * 50)
    accuracy, reward = value("accuracy", run), value("reward", run)

    q = 202 / 204
    assert accuracy.stderr == pytest.approx(math.sqrt(q * (1 - q) / 204))
    assert reward.stderr == accuracy.stderr


def test_the_spread_of_one_reward_is_no_samples() -> None:
    assert is_no_samples(computed("reward_std", sampled([[(True, 1.0)]])), "reward_std")
