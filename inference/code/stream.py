"""A code job's judging, streamed: each batch's samples go to the sandbox as soon as they are generated.

Generation is the accelerator's work and judging the sandbox's (processes on the host's cores). One after
the other, the accelerator idles while the programs run. Here rank 0 hands each batch it generates to a
:class:`~inference.code.judge.JudgingPool` and goes on with the next batch, so the sandboxed runs overlap
generation. What remains after generation (the tail) is what was not judged by then: the runs of the last
batches, and the samples of the other data-parallel replicas, which reach rank 0 only with the gather at
the end. The results are those of judging everything afterwards: the same pool, the same caches, and every
sample's result taken in the eval set's order.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

import structlog

from inference.code.grading import SampleResult
from inference.code.judge import Judge, JudgingPool, when_all
from inference.code.problems import CodeProblem

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from inference.generation import Agreement, Batch, Decoding, EndAgreement, Generation

log = structlog.get_logger("inference.code")

T = TypeVar("T")
R = TypeVar("R")


class JudgingStream:
    """Judges a job's samples as they are handed in, batch by batch; :meth:`results` hands in the rest
    and returns every sample's result in order. Use it in a ``with``: it holds the pool's threads."""

    def __init__(self, judge: Judge, problems: Sequence[CodeProblem]) -> None:
        """``problems[position]`` is the problem of the eval set's item at that position."""
        self.judge = judge
        self.problems = tuple(problems)
        #: Seconds :meth:`results` waited for verdicts: judging left on the critical path.
        self.tail_s = 0.0
        self._pool: JudgingPool | None = None
        self._handed: dict[tuple[int, int], tuple[str, Future[SampleResult]]] = {}

    def __enter__(self) -> JudgingStream:
        self._pool = JudgingPool(self.judge)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._pool is not None:
            self._pool.close(cancel=kind is not None)

    def hand_in(self, batch: int, generated: Mapping[int, Sequence[str]]) -> None:
        """One batch's samples (each item's responses, by the item's position in the eval set), judged
        from now on in the pool's threads; returns at once."""
        pool = self._opened()
        started = time.perf_counter()
        futures = []
        for position, responses in generated.items():
            for number, response in enumerate(responses):
                future = pool.submit(self.problems[position], response)
                self._handed[(position, number)] = (response, future)
                futures.append(future)
        log.info("code.batch_queued", task=self.judge.task_name, batch=batch, samples=len(futures))

        def judged() -> None:
            took = round(time.perf_counter() - started, 3)
            name = self.judge.task_name
            log.info("code.batch_judged", task=name, batch=batch, samples=len(futures), judge_s=took)

        when_all(futures, judged)

    def results(self, responses: Sequence[Sequence[str]]) -> list[SampleResult]:
        """The result of every item's every response (``responses[position]``), in order: those handed
        in already are waited for, the others (other replicas') handed in now."""
        pool = self._opened()
        waiting = time.perf_counter()
        futures = []
        late = 0
        for position, samples in enumerate(responses):
            for number, response in enumerate(samples):
                handed = self._handed.get((position, number))
                # A response must be judged as it is stored: one that differs from what was handed in
                # (which the gather never does) is judged again rather than trusted.
                if handed is None or handed[0] != response:
                    late += 1
                    handed = (response, pool.submit(self.problems[position], response))
                futures.append(handed[1])
        results = [future.result() for future in futures]
        self.tail_s = time.perf_counter() - waiting
        log.info(
            "code.judged",
            task=self.judge.task_name,
            samples=len(results),
            streamed=len(results) - late,
            late=late,
            tail_s=round(self.tail_s, 3),
        )
        return results

    def _opened(self) -> JudgingPool:
        if self._pool is None:
            raise RuntimeError("JudgingStream used outside its with block")
        return self._pool


def generate_judging(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    batches: Sequence[Batch],
    decoding: Decoding,
    stream: JudgingStream,
    *,
    item_keys: Sequence[int],
    agree: Agreement | None = None,
    agree_ends: EndAgreement | None = None,
) -> tuple[dict[int, list[Generation]], list[float]]:
    """:func:`~inference.generation.run_batches`, handing each batch's samples to ``stream`` as soon as
    it is generated; ``item_keys`` maps a prompt index to its item's position in the eval set."""
    from inference.generation import run_batches

    generated: dict[int, list[Generation]] = {}
    latencies: list[float] = []
    for number, batch in enumerate(batches):
        done, took = run_batches(
            model,
            tokenizer,
            [batch],
            decoding,
            item_keys=item_keys,
            agree=None if agree is None else _numbered(agree, number),
            agree_ends=None if agree_ends is None else _numbered(agree_ends, number),
        )
        generated.update(done)
        latencies.extend(took)
        texts = {item_keys[local]: [g.text for g in samples] for local, samples in done.items()}
        stream.hand_in(number, texts)
    return generated, latencies


def _numbered(vote: Callable[[int, T], R], number: int) -> Callable[[int, T], R]:
    # run_batches numbers the one batch it is given 0; the tp votes must see its number in the job.
    return lambda _, value: vote(number, value)
