"""Config: validated once, every bad field named with its path, env overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.config import Config, config_path, load_config
from daemon.errors import ConfigError

GOOD = """
[database]
url = "sqlite:///evald.db"

[[runs]]
name = "grpo-7b"
root = "runs/grpo"

[[tasks]]
name = "math"
dataset = "data/math.jsonl"
prompt_template = "Q: {prompt}\\nA:"
max_new_tokens = 64
"""


def _write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "data").mkdir(exist_ok=True)
    (tmp_path / "data" / "math.jsonl").write_text('{"problem": "1+1", "answer": "2"}\n')
    path = tmp_path / "evald.toml"
    path.write_text(text)
    return path


def test_good_config_resolves_paths_beside_the_file(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, GOOD), environ={})
    assert isinstance(config, Config)
    assert config.database.url == f"sqlite:///{tmp_path / 'evald.db'}"
    assert config.runs[0].root == tmp_path / "runs" / "grpo"
    assert config.tasks[0].dataset == tmp_path / "data" / "math.jsonl"
    assert config.tasks_for(config.runs[0])[0].name == "math"
    assert config.daemon.state_dir == tmp_path / "state"


def test_every_bad_field_is_named_with_its_path(tmp_path: Path) -> None:
    bad = (
        GOOD
        + """
[[tasks]]
name = "aime"
dataset = "data/missing.jsonl"
max_new_tokens = 0
prompt_template = "{question}"

[scheduling]
quiet_secs = -1
quite = 3
"""
    )
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, bad), environ={})
    problems = info.value.problems
    assert f"tasks[1].dataset: file not found: {tmp_path / 'data' / 'missing.jsonl'}" in problems
    assert any(p.startswith("tasks[1].max_new_tokens: ") for p in problems)
    assert any(p.startswith("tasks[1].prompt_template: must be a format string") for p in problems)
    assert any(p.startswith("scheduling.quiet_secs: ") for p in problems)
    assert "scheduling.quite: unknown field" in problems
    assert len(problems) == 5


def test_cross_references_are_checked(tmp_path: Path) -> None:
    bad = GOOD.replace('root = "runs/grpo"', 'root = "runs/grpo"\ntasks = ["math", "gsm8k"]') + GOOD.split(
        "[[tasks]]"
    )[1].join(["[[tasks]]", ""])
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, bad), environ={})
    assert "tasks: duplicate name math" in info.value.problems
    assert "runs[0].tasks[1]: unknown task 'gsm8k' (defined: math)" in info.value.problems


def test_missing_sections_and_toml_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, "[database]\nurl = 'sqlite:///x.db'\n"), environ={})
    assert info.value.problems == ["runs: required field is missing", "tasks: required field is missing"]
    with pytest.raises(ConfigError, match=r"not valid TOML: .*line 2"):
        load_config(_write(tmp_path, "[database]\nurl = \n"), environ={})
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "nope.toml", environ={})


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD)
    env = {"EVALD_DATABASE_URL": "postgresql://evald@db.internal/evald", "EVALD_SCHEDULING_QUIET_SECS": "2.5"}
    config = load_config(path, environ=env)
    assert config.database.url == "postgresql://evald@db.internal/evald"
    assert config.scheduling.quiet_secs == 2.5
    with pytest.raises(ConfigError, match=r"scheduling\.quiet_secs"):
        load_config(path, environ={"EVALD_SCHEDULING_QUIET_SECS": "soon"})


def test_config_path_precedence() -> None:
    assert config_path("a.toml", {"EVALD_CONFIG": "b.toml"}) == Path("a.toml")
    assert config_path(None, {"EVALD_CONFIG": "b.toml"}) == Path("b.toml")
    assert config_path(None, {}) == Path("evald.toml")


SCHEDULED = (
    GOOD
    + """
[scheduling]
freq_steps = 50
freq_secs = 1800
backlog = "oldest_first"

[scheduling.resources]
min_gpu_free_memory = "20GiB"
max_gpu_utilization = "80%"
min_host_free_memory = "512MiB"
gpus = [0, 1]

[scheduling.two_stage.math]
quick_size = 64
stratify_field = "level"
full_every = 4
"""
)


def test_scheduling_policy_resolves_per_run(tmp_path: Path) -> None:
    text = SCHEDULED.replace(
        'root = "runs/grpo"',
        'root = "runs/grpo"\nfreq_steps = 20\nbacklog = "newest_only"\n'
        '[runs.adaptive]\ntask = "math"\nmin_every_steps = 10\nmax_every_steps = 200',
    )
    config = load_config(_write(tmp_path, text), environ={})
    run = config.runs[0]
    frequency = config.scheduling.frequency_for(run)
    assert (frequency.steps, frequency.epochs, frequency.secs) == (
        20,
        None,
        1800,
    )  # the run's, then the default
    assert config.scheduling.backlog_for(run) == "newest_only"
    resources = config.scheduling.resources
    assert resources.min_gpu_free_memory == 20 * 2**30
    assert resources.max_gpu_utilization == 80.0
    assert resources.min_host_free_memory == 512 * 2**20
    assert config.scheduling.two_stage["math"].subset().size == 64
    assert run.adaptive is not None and run.adaptive.metric == "accuracy"


@pytest.mark.parametrize(
    ("replace", "by", "problem"),
    [
        (
            "freq_steps = 50",
            "freq_steps = 0",
            "scheduling.freq_steps: Input should be greater than or equal to 1",
        ),
        ("freq_secs = 1800", "freq_secs = -5", "scheduling.freq_secs: Input should be greater than 0"),
        ('backlog = "oldest_first"', 'backlog = "random"', "scheduling.backlog: Input should be"),
        (
            'min_gpu_free_memory = "20GiB"',
            'min_gpu_free_memory = "80%"',
            "scheduling.resources.min_gpu_free_memory: '80%' is a percentage, not a memory size",
        ),
        (
            'min_gpu_free_memory = "20GiB"',
            "min_gpu_free_memory = 20",
            "scheduling.resources.min_gpu_free_memory: 20 needs a unit",
        ),
        (
            'max_gpu_utilization = "80%"',
            'max_gpu_utilization = "20GiB"',
            "scheduling.resources.max_gpu_utilization: '20GiB' is a memory size, not a percentage",
        ),
        (
            'max_gpu_utilization = "80%"',
            "max_gpu_utilization = 0.8",
            "scheduling.resources.max_gpu_utilization: 0.8 looks like a fraction",
        ),
        (
            "[scheduling.two_stage.math]",
            "[scheduling.two_stage.gsm8k]",
            "scheduling.two_stage.gsm8k: unknown task 'gsm8k' (defined: math)",
        ),
        ("full_every = 4", "full_every = 0", "scheduling.two_stage.math.full_every: Input should be greater"),
        ("gpus = [0, 1]", "gpus = [0, 0]", "scheduling.resources.gpus: must list distinct GPU indices"),
    ],
)
def test_bad_scheduling_input_names_the_field(tmp_path: Path, replace: str, by: str, problem: str) -> None:
    assert replace in SCHEDULED
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, SCHEDULED.replace(replace, by)), environ={})
    assert any(p.startswith(problem) for p in info.value.problems), info.value.problems


@pytest.mark.parametrize(
    ("run_extra", "problem"),
    [
        ("freq_steps = -20", "runs[0].freq_steps: Input should be greater than or equal to 1"),
        ("freq_epochs = 0", "runs[0].freq_epochs: Input should be greater than or equal to 1"),
        ("eval_before_train = true", "runs[0]: eval_before_train needs base_model"),
        ('base_model = "nowhere"', "runs[0].base_model: not a directory"),
        (
            '[runs.adaptive]\ntask = "gsm8k"\nmin_every_steps = 10\nmax_every_steps = 100',
            "runs[0].adaptive.task: 'gsm8k' is not a task of this run (its tasks: math)",
        ),
        (
            '[runs.adaptive]\ntask = "math"\nmetric = "bleu"\nmin_every_steps = 10\nmax_every_steps = 100',
            "runs[0].adaptive.metric: task 'math' does not compute 'bleu'",
        ),
        (
            '[runs.adaptive]\ntask = "math"\nmin_every_steps = 100\nmax_every_steps = 10',
            "runs[0].adaptive: min_every_steps (100) is larger than max_every_steps (10)",
        ),
    ],
)
def test_bad_run_schedule_names_the_field(tmp_path: Path, run_extra: str, problem: str) -> None:
    text = GOOD.replace('root = "runs/grpo"', f'root = "runs/grpo"\n{run_extra}')
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, text), environ={})
    assert any(p.startswith(problem) for p in info.value.problems), info.value.problems


def test_task_kinds_metrics_and_rewards(tmp_path: Path) -> None:
    text = (
        GOOD
        + """
metrics = ["accuracy", "pass@8", "maj@8", "group_zero_spread", "entropy"]
n_samples = 8
temperature = 0.8
reward = "my_rewards.math:score"
reward_timeout_s = 2.5

[[tasks]]
name = "heldout-ppl"
kind = "likelihood"
dataset = "data/math.jsonl"
text_field = "problem"
max_length = 512
"""
    )
    config = load_config(_write(tmp_path, text), environ={})
    math, ppl = config.tasks

    assert math.metrics == ("accuracy", "pass@8", "maj@8", "group_zero_spread", "entropy")
    assert (math.spec().reward, math.spec().reward_timeout_s, math.spec().n_samples) == (
        "my_rewards.math:score",
        2.5,
        8,
    )
    assert ppl.metrics == ("perplexity", "nll", "tokens_per_s", "wall_s")
    assert (ppl.spec().kind, ppl.spec().text_field, ppl.spec().max_length) == ("likelihood", "problem", 512)
    assert GOOD and load_config(_write(tmp_path, GOOD), environ={}).tasks[0].metrics == (
        "accuracy",
        "response_length",
        "truncation_rate",
        "tokens_per_s",
        "wall_s",
    )


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        (
            'metrics = ["accuracy", "rouge"]',
            "tasks[0]: metrics: unknown metric 'rouge' (known: ",
        ),
        ('metrics = ["pass@4"]', "tasks[0]: metrics: metric 'pass@4' needs n_samples >= 4"),
        (
            'metrics = ["perplexity"]',
            "tasks[0]: metrics: metric 'perplexity' does not apply to a generate",
        ),
        ('reward = "no_colon"', "tasks[0].reward: String should match pattern"),
        (
            'kind = "likelihood"\nreward = "a:b"',
            'tasks[0]: reward: only for kind = "generate" tasks',
        ),
        ('kind = "ranking"', "tasks[0].kind: Input should be 'generate', 'code', 'likelihood' or 'lm_eval'"),
        ('system_prompt = "Be brief."', "tasks[0]: system_prompt: only used with chat_template = true"),
    ],
)
def test_bad_task_fields_are_named(tmp_path: Path, extra: str, problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, GOOD + extra + "\n"), environ={})

    assert any(p.startswith(problem) for p in info.value.problems), info.value.problems


def test_a_task_subset_is_fixed_seeded_and_stratified(tmp_path: Path) -> None:
    text = GOOD + '\n[tasks.subset]\nsize = 100\nseed = 7\nstratify_field = "level"\n'

    spec = load_config(_write(tmp_path, text), environ={}).tasks[0].spec()

    assert spec.subset is not None
    assert (spec.subset.size, spec.subset.seed, spec.subset.stratify_field) == (100, 7, "level")
    assert spec.stage_subset is None
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, GOOD + "\n[tasks.subset]\nsize = 0\n"), environ={})
    assert any(p.startswith("tasks[0].subset.size: ") for p in info.value.problems), info.value.problems
