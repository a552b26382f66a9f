"""The plain contract between the daemon and an evaluation worker.

The daemon writes a :class:`JobSpec` as JSON, starts ``python -m inference.worker SPEC``, and reads a
:class:`JobResult` from ``spec.result_path``. Nothing else crosses the boundary: the worker never touches
the database and the daemon never holds a model.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

#: Exit status of a worker that rejected its input (bad checkpoint, bad dataset): the result file holds
#: the error. Any other non-zero status is a crash, and the daemon keeps the stderr tail.
EXIT_INPUT_ERROR = 3

#: Exit status of a worker (or one rank of it) that ran out of device or host memory: the daemon retries
#: the job with half the batch size.
EXIT_OUT_OF_MEMORY = 4

#: Exit status of a worker (or one rank of it) that could not write its result file for want of space
#: (ENOSPC, EDQUOT): the host's fault, not the checkpoint's; the daemon requeues the job without spending
#: an attempt.
EXIT_DISK_FULL = 5

#: The daemon's pid, set in a worker's environment: the worker dies with it (see ``inference.worker``).
PARENT_PID_ENV = "EVALD_PARENT_PID"

ErrorKind = Literal[
    "checkpoint_invalid", "checkpoint_vanished", "dataset_invalid", "task_invalid", "out_of_memory"
]

#: The inference engines: DeepSpeed AutoTP (tensor parallel, any tp) or plain transformers (tp = 1).
Engine = Literal["deepspeed", "hf"]


class _Plain(BaseModel):
    # A diverged checkpoint's NaN perplexity is a result to store, not a file the daemon cannot read back.
    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="constants")


class SubsetSpec(_Plain):
    """A fixed, seeded, stratified subset of a task's rows: the same items at every checkpoint."""

    #: Rows in the subset (all of them when the dataset has fewer).
    size: int = Field(ge=1)
    #: The draw's seed: the same seed picks the same rows at every checkpoint and after a restart.
    seed: int = 0
    #: Field whose value (a string or a number) puts a row in its stratum; ``None`` samples plainly.
    stratify_field: str | None = None


#: What a task does: generate answers to prompts (graded against references), generate code (run against
#: the problem's tests in a sandbox), score held-out text, or run an lm-evaluation-harness task.
TaskKind = Literal["generate", "code", "likelihood", "lm_eval"]

#: The rule-based math reward built in: 1.0 for an answer math-verify grades correct, else 0.0.
BUILTIN_REWARD = "inference.rewards:math_reward"


class HarnessSpec(_Plain):
    """An lm-evaluation-harness task, run by lm-eval itself on the model the worker loaded."""

    #: A task, group or tag name lm-eval knows (its own, or one defined under ``include_path``).
    task: str
    #: Folder of the user's task YAML files; lm-eval runs with it as its working directory, so relative
    #: ``data_files`` resolve against it.
    include_path: Path | None = None
    #: Few-shot examples per prompt; ``None`` keeps the task's own setting.
    num_fewshot: int | None = Field(default=None, ge=0)
    #: HFLM's ``add_bos_token``; ``None`` keeps lm-eval's default (the tokenizer's own special tokens).
    add_bos_token: bool | None = None


class CodeLimits(_Plain):
    """What one execution in the sandbox may use (rlimits, the tmp size and a wall clock)."""

    #: CPU seconds (RLIMIT_CPU); past it the program is killed and the test is a timeout.
    cpu_s: float = Field(default=5.0, gt=0)
    #: Seconds of wall clock, after which the whole process tree is killed (a program that sleeps).
    wall_s: float = Field(default=10.0, gt=0)
    #: Address space in MiB (RLIMIT_AS): an allocation past it fails (the ``memory`` verdict).
    memory_mb: int = Field(default=1024, ge=16)
    #: Processes and threads of the sandbox (RLIMIT_NPROC, counted within its own user namespace).
    processes: int = Field(default=64, ge=1)
    #: Largest file it may write, stdout and stderr included, in MiB (RLIMIT_FSIZE).
    file_mb: int = Field(default=16, ge=1)
    #: Open file descriptors (RLIMIT_NOFILE).
    open_files: int = Field(default=64, ge=8)
    #: Size of its private writable ``/tmp`` (a tmpfs), in MiB.
    tmp_mb: int = Field(default=64, ge=1)


class CodeSpec(_Plain):
    """``kind = "code"``: how the generated code is taken from a response, run and tested."""

    #: A runner of :mod:`inference.code.runners`: ``python`` or ``cpp``.
    language: str = "python"
    #: The interpreter or compiler; ``None`` takes the runner's (``python3``, ``g++``) from the system
    #: ``PATH`` (``/usr/local/bin:/usr/bin:/bin``), not the worker's virtual environment.
    executable: str | None = None
    #: ``bwrap`` runs every execution in a bubblewrap sandbox, and the task fails if it cannot start one;
    #: ``none`` runs the model's code as a plain subprocess with rlimits only: no isolation at all.
    sandbox: Literal["bwrap", "none"] = "bwrap"
    #: Sandboxed executions at once (threads waiting on them, while the model generates the next batches).
    parallel: int = Field(default=4, ge=1)
    limits: CodeLimits = CodeLimits()
    #: Compiled languages: seconds (CPU and wall) the compiler may take.
    compile_s: float = Field(default=30.0, gt=0)
    #: Compiled languages: MiB of address space the compiler may use.
    compile_memory_mb: int = Field(default=2048, ge=64)
    #: ``assert``: test code run after the solution (HumanEval ``test`` + ``entry_point``, MBPP
    #: ``test_list``); ``stdio``: inputs and expected outputs; ``auto``: whichever a row has.
    test_format: Literal["auto", "assert", "stdio"] = "auto"
    #: Field holding the tests; ``None`` looks for ``test``, ``test_list``, then ``tests``,
    #: ``input_output``, ``public_tests``, ``public_test_cases``.
    tests_field: str | None = None
    #: Assert tests: the field naming the function the test's ``check`` is called with.
    entry_point_field: str = "entry_point"
    #: Field of code the response continues (``append``), HumanEval's ``prompt``; ``None``: the prompt
    #: field when the row has an entry point, else nothing.
    prefix_field: str | None = None
    #: ``fenced``: the last fenced code block of the response; ``append``: the prefix and the response
    #: (a base model completing a function); ``auto``: a fenced block if there is one, else ``append``.
    extract: Literal["auto", "fenced", "append"] = "auto"
    #: Stdin/stdout tests: how a program's output is compared with the expected one. ``exact``: the same
    #: text (line endings and final newlines aside); ``lines``: line by line, trailing spaces and blank
    #: lines ignored; ``tokens``: the same whitespace-separated tokens (Codeforces' default checker);
    #: ``float``: tokens, numbers equal within ``float_tolerance`` absolute or relative, integers exactly;
    #: ``auto``: what the dataset's shape implies: ``float`` for APPS (``input_output``), CodeContests
    #: (``public_tests``) and LiveCodeBench (``public_test_cases``) rows, ``tokens`` for ``tests``.
    compare: Literal["auto", "exact", "lines", "tokens", "float"] = "auto"
    #: ``compare = "float"``: the absolute or relative difference two numbers may have (0: equal values).
    float_tolerance: float = Field(default=1e-6, ge=0)


class TaskSpec(_Plain):
    """One evaluation task, as the worker needs it."""

    name: str
    kind: TaskKind = "generate"
    #: The JSONL file of a generate or likelihood task; lm_eval tasks read their own data.
    dataset: Path | None = None
    #: ``kind = "lm_eval"``: the lm-eval task to run (``batch_size`` and ``limit`` apply to it too).
    lm_eval: HarnessSpec | None = None
    #: ``kind = "code"``: the language, sandbox, limits and test format.
    code: CodeSpec | None = None
    #: Field holding the prompt; ``None`` takes the first of ``prompt``, ``question``, ``problem``.
    prompt_field: str | None = None
    answer_field: str = "answer"
    id_field: str | None = None
    #: Likelihood tasks: the field holding the text to score.
    text_field: str = "text"
    #: Likelihood tasks: longer texts are cut to this many tokens.
    max_length: int = Field(default=2048, ge=2)
    #: ``str.format`` template with the placeholder ``{prompt}``.
    prompt_template: str = "{prompt}"
    #: Wrap the prompt as a user message in the tokenizer's chat template (with a generation prompt).
    chat_template: bool = False
    #: With ``chat_template``: a system message before the prompt.
    system_prompt: str | None = None
    #: ``module:function`` called with (prompt, response, reference) that returns a float; ``None`` with a
    #: reward metric uses :data:`BUILTIN_REWARD`.
    reward: str | None = None
    #: Seconds one reward call may take before the sample is reported and the next one goes on.
    reward_timeout_s: float = Field(default=10.0, gt=0)
    max_new_tokens: int = Field(default=32, ge=1)
    batch_size: int = Field(default=16, ge=1)
    #: Completions per prompt; more than one needs ``temperature > 0``.
    n_samples: int = Field(default=1, ge=1)
    #: 0 decodes greedily; above 0 samples, re-seeded per batch so every run and tp rank draws alike.
    temperature: float = Field(default=0.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    #: A response ends at the first of these strings (which is cut off), as at an EOS token.
    stop: tuple[str, ...] = ()
    #: Evaluate only the first ``limit`` rows; ``None`` evaluates all.
    limit: int | None = Field(default=None, ge=1)
    #: Evaluate only this subset of the rows (taken after ``limit``); ``None`` evaluates all.
    subset: SubsetSpec | None = None
    #: A quick stage's subset, taken from the task's items (after ``subset``).
    stage_subset: SubsetSpec | None = None
    #: ``inference.metrics.DEFAULT_METRICS["generate"]``: the daemon's config fills the default per kind.
    metrics: tuple[str, ...] = ("accuracy", "response_length", "truncation_rate", "tokens_per_s", "wall_s")


class InferenceSpec(_Plain):
    engine: Engine = "deepspeed"
    #: How generation batches sequences (``inference.engines``): ``auto`` picks per device and tp.
    batching: Literal["auto", "fixed", "continuous", "paged"] = "auto"
    #: ``cpu`` or ``cuda``; a worker group puts rank r on the r-th visible device of its node.
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    #: torch intra-op threads per rank; ``None`` leaves torch's default.
    threads: int | None = Field(default=None, ge=1)
    #: Tensor-parallel ranks per replica (DeepSpeed AutoTP) and data-parallel replicas: world = tp × dp.
    tp: int = Field(default=1, ge=1)
    dp: int = Field(default=1, ge=1)

    @property
    def world_size(self) -> int:
        return self.tp * self.dp


class JobSpec(_Plain):
    job_id: int
    checkpoint_path: Path
    layout: str = "hf"
    #: HF config (and tokenizer) folder for layouts whose checkpoints hold only tensors.
    hf_config: Path | None = None
    #: The run's root: without ``hf_config``, a config.json is looked for up to it from the checkpoint.
    run_root: Path | None = None
    #: The base model a LoRA adapter checkpoint is merged into (``runs[].base_model``).
    base_model: Path | None = None
    task: TaskSpec
    inference: InferenceSpec = InferenceSpec()
    result_path: Path
    seed: int = 0
    #: How many per-sample outputs to return, the first ones (the rest are only aggregated); failed
    #: samples are returned beyond it, up to as many again, and every one is in ``JobResult.problems``.
    max_samples: int = Field(default=1000, ge=0)
    #: Longest text kept per sample field; longer text is cut and marked.
    max_text_chars: int = Field(default=2000, ge=16)


class MetricValue(_Plain):
    name: str
    value: float
    #: Number of items the aggregate is over; ``None`` where a count has no meaning (wall time).
    n: int | None = None
    #: Standard error of ``value``; ``None`` where it has no meaning.
    stderr: float | None = None


class SampleOutput(_Plain):
    #: Position in the job's output: item ``index // n_samples``, completion ``index % n_samples``.
    index: int
    prompt_id: str
    prompt: str
    response: str
    extracted: str | None
    reference: str
    #: Graded right or wrong; ``None`` for a sample with no right answer (an lm-eval rolling
    #: log-likelihood, perplexity, sample: it has a score, not a grade).
    correct: bool | None
    tokens: int
    truncated: bool
    #: The task's reward for this response; ``None`` when the task computes none or the reward failed.
    reward: float | None = None
    #: Mean token entropy of the policy over this response's tokens, in nats.
    entropy: float | None = None
    #: Why this sample is left out of every metric (its reward raised, hung or was not a number).
    error: str | None = None
    #: ``kind = "code"``: ``passed``, or the verdict of the first test that failed (``wrong_answer``,
    #: ``runtime_error``, ``compile_error``, ``timeout``, ``memory``, ``interfered``).
    verdict: str | None = None
    tests_passed: int | None = None
    tests_total: int | None = None
    #: Tests by verdict, e.g. ``{"passed": 7, "timeout": 1}``.
    verdicts: dict[str, int] | None = None
    #: The first failing test (its code, or its input and expected output) and what the program wrote.
    failed_test: str | None = None
    failed_output: str | None = None

    @model_serializer(mode="wrap")
    def _code_fields_when_set(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A sample of any other kind of task serialises exactly as before these fields existed, so that
        # readers mapping each field to a column (the daemon's sample rows) see no new key.
        data: dict[str, Any] = handler(self)
        for name in CODE_SAMPLE_FIELDS:
            if data.get(name) is None:
                data.pop(name, None)
        return data


#: The fields of :class:`SampleOutput` only a code task fills (left out of its dump when unset).
CODE_SAMPLE_FIELDS = ("verdict", "tests_passed", "tests_total", "verdicts", "failed_test", "failed_output")


class Problem(_Plain):
    """An input left out of a job's metrics: a bad dataset row, or a sample whose reward failed.
    One bad input never fails the job; it is counted and reported here."""

    #: Where: ``FILE:LINE`` for a dataset row, ``sample INDEX`` for a sample.
    where: str
    message: str
    prompt_id: str | None = None
    #: The sample's index (see :class:`SampleOutput`); ``None`` for a dataset row.
    index: int | None = None


class Timing(_Plain):
    load_s: float
    eval_s: float
    total_s: float
    #: Seconds spent grading answers and computing rewards (part of ``eval_s``).
    grading_s: float = 0.0


class WorkerError(_Plain):
    kind: ErrorKind
    message: str


class Disagreement(_Plain):
    """One batch whose tp ranks generated different tokens."""

    replica: int
    batch: int
    #: tp ranks (within the replica) whose tokens lost the vote.
    outvoted: tuple[int, ...]
    #: No strict majority: the tp head's tokens were kept.
    tie: bool


class Consistency(_Plain):
    """The tp ranks' per-batch comparison of their generated token ids."""

    batches_checked: int = 0
    disagreements: tuple[Disagreement, ...] = ()

    @classmethod
    def of_replicas(cls, replicas: Iterable[tuple[int, Sequence[Disagreement]]]) -> Consistency:
        """The job's comparison from each replica's (batches checked, disagreements found)."""
        checks = list(replicas)
        return cls(
            batches_checked=sum(checked for checked, _ in checks),
            disagreements=tuple(d for _, found in checks for d in found),
        )


class JobResult(_Plain):
    job_id: int
    metrics: tuple[MetricValue, ...] = ()
    samples: tuple[SampleOutput, ...] = ()
    #: Bad dataset rows and failed samples, left out of the metrics (every one, whatever ``max_samples``).
    problems: tuple[Problem, ...] = ()
    timing: Timing | None = None
    error: WorkerError | None = None
    #: Filled when tp > 1.
    consistency: Consistency | None = None

    def write(self, path: Path) -> None:
        """Write atomically, so the daemon never reads half a result."""
        tmp = path.with_name(path.name + ".tmp")
        try:
            tmp.write_text(self.model_dump_json(indent=1), encoding="utf-8")
        except OSError:
            # Half a file on a full disk only takes the room the next writer needs.
            tmp.unlink(missing_ok=True)
            raise
        tmp.replace(path)

    @classmethod
    def read(cls, path: Path) -> JobResult:
        return cls.model_validate_json(path.read_text(encoding="utf-8"))
