"""Policy entropy: the formula on a small case, and the meter in generate against a direct forward pass."""

from __future__ import annotations

import math

import pytest
import torch

from inference.entropy import token_entropy
from inference.generation import Decoding, generate
from inference.loader import load_model
from inference.spec import InferenceSpec
from inference.toy.problems import held_out_problems
from tests.conftest import ToyRun


def test_token_entropy_on_a_small_case() -> None:
    logits = torch.tensor(
        [[math.log(0.5), math.log(0.25), math.log(0.25)], [0.0, 0.0, 0.0], [0.0, -1e9, -1e9]]
    )

    entropy = token_entropy(logits)

    # -(0.5 ln 0.5 + 2 · 0.25 ln 0.25) = 1.5 ln 2; uniform over 3: ln 3; one certain token: 0.
    assert entropy.tolist() == pytest.approx([1.5 * math.log(2), math.log(3), 0.0], abs=1e-6)
    # Temperature 2 on logits (ln 4, 0): softmax of (ln 2, 0) is (2/3, 1/3).
    hot = token_entropy(torch.tensor([[math.log(4.0), 0.0]]), temperature=2.0)
    assert hot.item() == pytest.approx(-(2 / 3) * math.log(2 / 3) - (1 / 3) * math.log(1 / 3))
    assert token_entropy(torch.tensor([[0.0, float("-inf")]])).item() == 0.0
    assert math.isnan(token_entropy(torch.tensor([[0.0, float("nan")]])).item())


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_generate_measures_the_entropy_of_each_generated_token(toy_run: ToyRun, temperature: float) -> None:
    loaded = load_model(toy_run.last_checkpoint, InferenceSpec(engine="hf", threads=1))
    tokenizer, model = loaded.tokenizer, loaded.model
    prompts = [f"{p.text}=" for p in held_out_problems(4, seed=2)]
    decoding = Decoding(max_new_tokens=12, temperature=temperature, n_samples=1, entropy=True, seed=3)

    run = generate(model, tokenizer, prompts, decoding, batch_size=4)

    for prompt, generation in zip(prompts, run.generations, strict=True):
        prompt_ids = tokenizer(prompt)["input_ids"]
        response_ids = tokenizer(generation.text, add_special_tokens=False)["input_ids"]
        ended = not generation.truncated
        # The steps that drew the response's tokens, and the end token's step when it ended.
        steps = len(response_ids) + (1 if ended else 0)
        ids = torch.tensor([prompt_ids + response_ids])
        with torch.inference_mode():
            logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : len(prompt_ids) - 1 + steps]
        direct = token_entropy(logits, temperature if temperature > 0 else 1.0).sum().item()
        assert generation.entropy_tokens == steps
        assert generation.entropy_sum == pytest.approx(direct, abs=1e-4)
    assert any(g.entropy_sum > 0 for g in run.generations)


def test_entropy_is_not_measured_unless_asked(toy_run: ToyRun) -> None:
    loaded = load_model(toy_run.last_checkpoint, InferenceSpec(engine="hf", threads=1))

    run = generate(loaded.model, loaded.tokenizer, ["1+2="], Decoding(max_new_tokens=4), batch_size=1)

    assert (run.generations[0].entropy_sum, run.generations[0].entropy_tokens) == (0.0, 0)
