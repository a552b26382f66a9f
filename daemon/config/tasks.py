"""``[[tasks]]``: what is evaluated at each checkpoint (generate, code, likelihood or lm-eval tasks)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, ValidationInfo, field_validator, model_validator

from daemon.config.base import Section, existing_file, resolve_path
from inference.errors import TaskInvalid
from inference.metrics import DEFAULT_METRICS, resolve_metrics
from inference.spec import CodeSpec, HarnessSpec, SubsetSpec, TaskKind, TaskSpec

#: Task settings that only an lm_eval task takes, and those it does not (its YAML defines them).
_HARNESS_FIELDS = frozenset({"lm_eval_task", "lm_eval_include_path", "num_fewshot", "add_bos_token"})
_NOT_HARNESS_FIELDS = frozenset(
    {
        "dataset",
        "prompt_field",
        "answer_field",
        "id_field",
        "text_field",
        "max_length",
        "prompt_template",
        "chat_template",
        "system_prompt",
        "max_new_tokens",
        "n_samples",
        "temperature",
        "top_p",
        "stop",
        "subset",
        "reward",
        "reward_timeout_s",
        "metrics",
    }
)


class TaskConfig(Section):
    """One evaluation: its data, how prompts are built and decoded, and the metrics computed."""

    #: The task's name in the database, reports and alerts; ``runs[].tasks``, ``[runs.adaptive] task``
    #: and ``[scheduling.two_stage.NAME]`` refer to it.
    name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._@-]*$")
    #: ``generate``: answers to prompts, graded against references; ``code``: programs generated for
    #: problems with tests, run in a sandbox; ``likelihood``: perplexity of texts; ``lm_eval``: an
    #: lm-evaluation-harness task, run by lm-eval on the loaded model.
    kind: TaskKind = "generate"
    #: The JSONL file (generate and likelihood tasks; an lm_eval task's YAML names its own data).
    dataset: Path | None = None
    #: The row field holding the prompt; unset: the first of ``prompt``, ``question``, ``problem`` a row has
    #: (code tasks look at a few more).
    prompt_field: str | None = None
    #: The row field holding the reference answer responses are graded against.
    answer_field: str = "answer"
    #: The row field holding a unique id, stored with each sample to pair an item across checkpoints;
    #: unset: the row's line number (so editing the file renumbers them).
    id_field: str | None = None
    #: Likelihood tasks: the row field holding the text to score.
    text_field: str = "text"
    #: Likelihood tasks: the tokens of a text scored; a longer text is cut to its first ``max_length``.
    max_length: int = Field(default=2048, ge=2)
    #: A Python format string with one ``{prompt}`` placeholder, applied to every prompt (a literal brace
    #: is written twice).
    prompt_template: str = "{prompt}"
    #: Wrap each prompt in the tokenizer's chat template, after ``system_prompt`` if set.
    chat_template: bool = False
    #: The system message put before each prompt in the chat template (needs ``chat_template = true``).
    system_prompt: str | None = None
    #: The most tokens generated per response: one that reaches it unfinished is cut there and counts as
    #: truncated (``truncation_rate``).
    max_new_tokens: int = Field(default=32, ge=1, le=65536)
    #: Prompts (or texts) run through the model together on each replica; larger is faster until the
    #: device runs out of memory. lm_eval tasks pass it to lm-eval.
    batch_size: int = Field(default=16, ge=1)
    #: Completions per prompt; more than one needs temperature > 0.
    n_samples: int = Field(default=1, ge=1)
    #: 0 decodes greedily.
    temperature: float = Field(default=0.0, ge=0)
    #: Nucleus sampling when ``temperature`` > 0: draw only from the most likely tokens whose
    #: probabilities add up to this; 1 keeps them all.
    top_p: float = Field(default=1.0, gt=0, le=1)
    #: A response ends at the first of these strings.
    stop: tuple[str, ...] = ()
    #: Evaluate only this many rows, the first ones (before ``subset``); lm_eval tasks: the first
    #: documents of each task. Unset: all of them.
    limit: int | None = Field(default=None, ge=1)
    #: Evaluate a fixed, seeded, stratified subset of the rows: the same items at every checkpoint.
    subset: SubsetSpec | None = None
    #: ``module:function(prompt, response, reference) -> float``; unset, reward metrics use the built-in
    #: math reward (1 for a correct answer, else 0).
    reward: str | None = Field(default=None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
    #: One reward call taking longer is stopped, and its sample reported.
    reward_timeout_s: float = Field(default=10.0, gt=0)
    #: Defaults by kind: see ``inference.metrics.DEFAULT_METRICS``.
    metrics: tuple[str, ...] = ()
    #: ``kind = "lm_eval"``: the task, group or tag name lm-eval knows (its own, or one of
    #: ``lm_eval_include_path``). ``batch_size`` and ``limit`` apply too.
    lm_eval_task: str | None = Field(default=None, min_length=1)
    #: lm_eval tasks: a folder of the user's own task YAMLs, searched besides lm-eval's (relative
    #: ``data_files`` resolve against it).
    lm_eval_include_path: Path | None = None
    #: lm_eval tasks: few-shot examples put before each question; unset: the task's own number.
    num_fewshot: int | None = Field(default=None, ge=0)
    #: lm_eval tasks: whether the tokenizer's BOS token starts each input (HFLM's ``add_bos_token``);
    #: unset: lm-eval's default.
    add_bos_token: bool | None = None
    #: ``[tasks.code]``: how a ``kind = "code"`` task's programs are taken from the responses, run and
    #: tested (language, sandbox, limits, test format); an lm_eval code task (humaneval, mbpp) takes its
    #: sandbox and limits from it too. Unset: the defaults (Python in a bubblewrap sandbox).
    code: CodeSpec | None = None

    @model_validator(mode="before")
    @classmethod
    def _default_metrics(cls, data: Any) -> Any:
        if isinstance(data, dict) and "metrics" not in data:
            kind = data.get("kind", "generate")
            return {**data, "metrics": DEFAULT_METRICS.get(kind, DEFAULT_METRICS["generate"])}
        return data

    @model_validator(mode="after")
    def _sampling(self) -> TaskConfig:
        if self.n_samples > 1 and self.temperature == 0:
            raise ValueError(
                f"n_samples = {self.n_samples} draws identical greedy answers: set temperature > 0"
            )
        if self.system_prompt is not None and not self.chat_template:
            raise ValueError("system_prompt: only used with chat_template = true")
        if self.code is not None and self.kind not in ("code", "lm_eval"):
            raise ValueError(f'code: only for kind = "code" tasks (and lm_eval code tasks), not {self.kind}')
        if self.kind == "lm_eval":
            self._check_lm_eval()
            return self
        harness_only = sorted(_HARNESS_FIELDS & self.model_fields_set)
        if harness_only:
            raise ValueError(f'{", ".join(harness_only)}: only for kind = "lm_eval" tasks')
        if self.dataset is None:
            raise ValueError(f'dataset: a {self.kind} task needs a JSONL file (dataset = "FILE.jsonl")')
        if self.kind == "likelihood":
            generate_only = [
                name
                for name, value in (
                    ("reward", self.reward),
                    ("chat_template", self.chat_template or None),
                    ("n_samples", self.n_samples if self.n_samples > 1 else None),
                )
                if value is not None
            ]
            if generate_only:
                raise ValueError(f'{", ".join(generate_only)}: only for kind = "generate" tasks')
        try:
            resolve_metrics(self.metrics, kind=self.kind, n_samples=self.n_samples)
        except TaskInvalid as exc:
            raise ValueError(f"metrics: {exc.message}") from exc
        return self

    def _check_lm_eval(self) -> None:
        from inference.harness.catalog import check_task

        foreign = sorted(f for f in self.model_fields_set & _NOT_HARNESS_FIELDS if f != "metrics")
        if self.metrics:
            foreign.append("metrics")
        if foreign:
            raise ValueError(
                f'{", ".join(foreign)}: not for kind = "lm_eval" tasks (the lm-eval task\'s YAML defines its '
                "data, prompts and metrics; every metric lm-eval reports is stored)"
            )
        if self.lm_eval_task is None:
            raise ValueError('lm_eval_task: kind = "lm_eval" needs the lm-eval task to run (e.g. "gsm8k")')
        try:
            check_task(self.lm_eval_task, self.lm_eval_include_path)
        except TaskInvalid as exc:
            raise ValueError(f"lm_eval_task: {exc.message}") from exc

    @field_validator("lm_eval_include_path")
    @classmethod
    def _include_path(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is None:
            return None
        path = resolve_path(value, info)
        if not path.is_dir():
            raise ValueError(f"folder not found: {path}")
        return path

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        return existing_file(value, info)

    @field_validator("prompt_template")
    @classmethod
    def _template(cls, value: str) -> str:
        try:
            value.format(prompt="")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(
                f"must be a format string whose only placeholder is {{prompt}} ({exc!r})"
            ) from exc
        return value

    def spec(self, stage_subset: SubsetSpec | None = None) -> TaskSpec:
        return TaskSpec(
            name=self.name,
            kind=self.kind,
            dataset=self.dataset,
            prompt_field=self.prompt_field,
            answer_field=self.answer_field,
            id_field=self.id_field,
            text_field=self.text_field,
            max_length=self.max_length,
            prompt_template=self.prompt_template,
            chat_template=self.chat_template,
            system_prompt=self.system_prompt,
            reward=self.reward,
            reward_timeout_s=self.reward_timeout_s,
            max_new_tokens=self.max_new_tokens,
            batch_size=self.batch_size,
            n_samples=self.n_samples,
            temperature=self.temperature,
            top_p=self.top_p,
            stop=self.stop,
            limit=self.limit,
            metrics=self.metrics,
            subset=self.subset,
            stage_subset=stage_subset,
            code=self.code,
            lm_eval=None
            if self.lm_eval_task is None
            else HarnessSpec(
                task=self.lm_eval_task,
                include_path=self.lm_eval_include_path,
                num_fewshot=self.num_fewshot,
                add_bos_token=self.add_bos_token,
            ),
        )
