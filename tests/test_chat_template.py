"""Chat templates: prompts wrapped as the tokenizer's chat format says, or a clear error without one."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from inference.errors import TaskInvalid
from inference.spec import InferenceSpec, JobSpec, TaskSpec
from inference.task import apply_chat_template
from inference.worker import run
from tests.conftest import ToyRun

TEMPLATE = (
    "{% for m in messages %}[{{ m.role }}]{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)


def task(dataset: Path, **fields: object) -> TaskSpec:
    return TaskSpec(name="chat", dataset=dataset, **fields)


def test_prompts_become_user_messages_after_the_system_prompt(toy_run: ToyRun, tmp_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(toy_run.last_checkpoint)
    tokenizer.chat_template = TEMPLATE

    plain = apply_chat_template(task(tmp_path, chat_template=True), tokenizer, ["1+2="])
    system = apply_chat_template(
        task(tmp_path, chat_template=True, system_prompt="Add."), tokenizer, ["1+2=", "3+4="]
    )

    assert plain == ["[user]1+2=\n[assistant]"]
    assert system == ["[system]Add.\n[user]1+2=\n[assistant]", "[system]Add.\n[user]3+4=\n[assistant]"]


def test_a_tokenizer_without_a_chat_template_is_the_tasks_error(toy_run: ToyRun, tmp_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(toy_run.last_checkpoint)

    with pytest.raises(
        TaskInvalid, match=r"task 'chat': chat_template = true, but the checkpoint's tokenizer"
    ):
        apply_chat_template(task(tmp_path, chat_template=True), tokenizer, ["1+2="])


def test_a_job_with_a_chat_template_generates_from_the_wrapped_prompt(
    toy_run: ToyRun, toy_dataset: Path, tmp_path: Path
) -> None:
    checkpoint = Path(shutil.copytree(toy_run.last_checkpoint, tmp_path / "checkpoint"))
    (checkpoint / "chat_template.jinja").write_text(TEMPLATE, encoding="utf-8")
    spec = JobSpec(
        job_id=3,
        checkpoint_path=checkpoint,
        result_path=tmp_path / "result.json",
        task=task(toy_dataset, chat_template=True, system_prompt="Add.", max_new_tokens=4, limit=3),
        inference=InferenceSpec(threads=1),
    )

    result, code = run(spec, 0)

    assert code == 0 and result is not None, result
    assert len(result.samples) == 3
    assert all(s.prompt.startswith("[system]Add.\n[user]") for s in result.samples)
    assert all(s.prompt.endswith("\n[assistant]") for s in result.samples)
