"""Reward functions against hand-written cases, and the reward-model folder contract."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch

from trinity_like.components import build_params
from trinity_like.errors import ConfigError, TrinityError
from trinity_like.explorer.rewards import (
    build_reward_fn,
    parse_final_answer,
    score_with_retries,
)
from trinity_like.models.reward_model import RewardModel, load_reward_model, save_reward_model
from trinity_like.models.tiny import build_tiny_model
from trinity_like.registry import REWARD_FN


@pytest.mark.parametrize(
    "text,want",
    [
        ("42", "42"),
        ("The sum is 1,234.", "1234"),
        ("first 3 then -7", "-7"),
        ("so \\boxed{17} and 99 later", "17"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{ 1,234 }", "1234"),
        ("\\boxed{x+1}", "x+1"),
        ("no digits", None),
        ("3.50 dollars", "3.50"),
    ],
)
def test_parse_final_answer(text, want):
    assert parse_final_answer(text) == want


@pytest.mark.parametrize(
    "response,answer,want",
    [
        ("57", "57", 1.0),
        ("The answer is 57.", "57", 1.0),
        ("57.0", "57", 1.0),
        ("56", "57", 0.0),
        ("57 or 58", "57", 0.0),
        ("\\boxed{57}", "57", 1.0),
        ("", "57", 0.0),
    ],
)
def test_exact_match(response, answer, want):
    assert build_reward_fn("exact_match")({"response": response, "answer": answer}) == want


@pytest.mark.parametrize(
    "response,answer,want",
    [
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("The answer is $\\frac{84}{2}$", "42", 1.0),
        ("\\boxed{41}", "42", 0.0),
        ("x = \\boxed{2\\sqrt{2}}", "\\sqrt{8}", 1.0),
        ("nothing", "3", 0.0),
    ],
)
def test_math_verify(response, answer, want):
    assert build_reward_fn("math_verify")({"response": response, "answer": answer}) == want


def test_format_reward_and_its_params():
    fn = build_reward_fn("format")
    assert fn({"response": " 42\n"}) == 1.0
    assert fn({"response": "It is 42"}) == 0.0
    boxed = build_reward_fn("format", {"pattern": r".*\\boxed\{.+\}.*", "penalty": -1.0})
    assert boxed({"response": "so \\boxed{3}"}) == 1.0 and boxed({"response": "3"}) == -1.0
    with pytest.raises(ConfigError, match="patern"):
        build_reward_fn("format", {"patern": "x"})


def test_registry_descriptions_exist():
    for name in ("exact_match", "math_verify", "format", "reward_model", "reasoning_gym"):
        assert REWARD_FN.describe(name)


def test_retries_then_reports_error_and_timeout():
    calls = []

    def flaky(inputs):
        calls.append(1)
        if len(calls) < 2:
            raise ValueError("transient")
        return 1.0

    out = score_with_retries(flaky, {}, retries=2, timeout_s=5)
    assert (out.reward, out.attempts) == (1.0, 2)

    def broken(inputs):
        raise KeyError("boom")

    out = score_with_retries(broken, {}, retries=1, timeout_s=5)
    assert out.reward is None and out.attempts == 2 and out.error.startswith("KeyError")

    def slow(inputs):
        time.sleep(30)
        return 1.0

    t0 = time.perf_counter()
    out = score_with_retries(slow, {}, retries=1, timeout_s=0.2)
    assert out.reward is None and out.error == "timeout" and out.attempts == 2
    assert time.perf_counter() - t0 < 15  # it stopped waiting; the sleeps go on in daemon threads
    assert score_with_retries(lambda _: float("nan"), {}, retries=0, timeout_s=1).reward is None


def test_reward_model_folder_round_trip_scores_like_a_manual_forward(tmp_path):
    backbone, tok = build_tiny_model(seed=4)
    torch.manual_seed(0)
    rm = RewardModel(backbone)
    path = save_reward_model(rm, tok, tmp_path / "rm")
    fn = build_reward_fn("reward_model", {"path": str(path)})
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    for response in ("5", "It is 6, I think"):
        got = fn({"messages": messages, "response": response})
        # Oracle: the full causal LM's last hidden layer at the last token, times the head, on
        # the layout the RM trainer sees: prompt with generation prompt + response + <|im_end|>.
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + response + "<|im_end|>"
        ids = torch.tensor([tok.encode(text, add_special_tokens=False)])
        with torch.no_grad():
            hidden = backbone(ids, output_hidden_states=True).hidden_states[-1][0, -1]
            want = float(hidden @ rm.head.weight[0] + rm.head.bias[0])
        assert got == pytest.approx(want, abs=1e-4)
    # Padding must not move the score: batch a short and a long conversation.
    model, tok2 = load_reward_model(path)
    from trinity_like.models.reward_model import score_conversations

    a = [*messages, {"role": "assistant", "content": "5"}]
    b = [*messages, {"role": "assistant", "content": "a much longer answer with 12 words"}]
    both = score_conversations(model, tok2, [a, b], 512)
    assert both[0] == pytest.approx(score_conversations(model, tok2, [a], 512)[0], abs=1e-4)


def test_reward_model_without_head_is_a_clear_error(tmp_path):
    path = build_tiny_model(tmp_path / "plain")
    with pytest.raises(TrinityError, match="reward_head.safetensors"):
        build_reward_fn("reward_model", {"path": str(path)})


def test_params_type_is_a_frozen_dataclass():
    params = build_params(REWARD_FN.get("format"), {"reward": 2})
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.reward = 3  # frozen
