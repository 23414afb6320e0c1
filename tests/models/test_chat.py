"""trinity_like.models.chat: assistant-only supervision, checked token by token against a ChatML
oracle and by decoding; and message_tokens, the chat template's tokens for new messages
appended after an action, checked against the template rendering the whole conversation."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from trinity_like.errors import TrinityError
from trinity_like.models.chat import end_of_turn, message_tokens, render_prompt, tokenize_chat, tokenize_response

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "<think>\nbe polite\n</think>\n\nHello there"},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "and 3+3?"},
    {"role": "assistant", "content": "<think>\nadd\n</think>\n\n6"},
]


def chatml_oracle_mask(tokenizer: Any, ids: list[int]) -> list[int]:
    """1 for tokens inside an assistant turn (after its header, through <|im_end|>), by walking ChatML."""
    start, end = tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    mask, role, state = [], "", "outside"
    for tid in ids:
        if tid == start:
            state, role = "header", ""
            mask.append(0)
        elif state == "header":
            piece = tokenizer.decode([tid])
            role += piece
            if "\n" in piece:
                state = "body"
            mask.append(0)
        elif state == "body":
            mask.append(int(role.strip() == "assistant"))
            if tid == end:
                state = "outside"
        else:
            mask.append(0)
    return mask


def masked_spans(tokenizer: Any, tokens: list[int], mask: list[int]) -> list[str]:
    """Decoded runs of consecutive masked tokens."""
    spans, run = [], []
    for tid, m in zip(tokens, mask):
        if m:
            run.append(tid)
        elif run:
            spans.append(tokenizer.decode(run))
            run = []
    return spans + ([tokenizer.decode(run)] if run else [])


@pytest.mark.parametrize("which", ["qwen3_tokenizer", "tiny_tokenizer"])
def test_multi_turn_mask_matches_the_chatml_oracle_token_by_token(which: str, request: pytest.FixtureRequest) -> None:
    tok = request.getfixturevalue(which)
    tokens, prompt_length, mask = tokenize_chat(tok, CONVERSATION)
    full_text = tok.apply_chat_template(CONVERSATION, tokenize=False)
    full_ids = tok(full_text, add_special_tokens=False)["input_ids"]
    oracle = chatml_oracle_mask(tok, full_ids)
    ours = [0] * prompt_length + mask
    assert tokens == full_ids[: len(tokens)]
    assert ours == oracle[: len(tokens)]
    assert not any(oracle[len(tokens) :])  # only unsupervised tokens were dropped at the end
    assert oracle.index(1) == prompt_length


def test_qwen3_renders_turns_by_position_and_the_mask_follows(qwen3_tokenizer: Any) -> None:
    tokens, prompt_length, mask = tokenize_chat(qwen3_tokenizer, CONVERSATION)
    assert qwen3_tokenizer.decode(tokens[:prompt_length]).endswith(
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert masked_spans(qwen3_tokenizer, tokens[prompt_length:], mask) == [
        "Hello there<|im_end|>",  # before the last user turn, Qwen3 drops the reasoning
        "4<|im_end|>",
        "<think>\nadd\n</think>\n\n6<|im_end|>",  # the last turn keeps its think block
    ]


def test_tiny_tokenizer_spans_decode_to_the_assistant_messages(tiny_tokenizer: Any) -> None:
    msgs = [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "5"}]
    tokens, prompt_length, mask = tokenize_chat(tiny_tokenizer, msgs)
    assert masked_spans(tiny_tokenizer, tokens[prompt_length:], mask) == ["5<|im_end|>"]
    assert len(tokens) == prompt_length + len(mask)


def test_a_conversation_without_assistant_is_refused(tiny_tokenizer: Any) -> None:
    with pytest.raises(ValueError, match="no assistant message"):
        tokenize_chat(tiny_tokenizer, [{"role": "user", "content": "hi"}])


def test_pair_pieces(qwen3_tokenizer: Any) -> None:
    tok = qwen3_tokenizer
    assert end_of_turn(tok) == "<|im_end|>"
    prompt = render_prompt(tok, [{"role": "user", "content": "hi"}])
    assert tok.decode(prompt) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(tokenize_response(tok, "a b", tok.convert_tokens_to_ids("<|im_end|>"))) == "a b<|im_end|>"


# -- message_tokens -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tok(tiny_tokenizer: Any) -> Any:
    return tiny_tokenizer


# SmolLM2's template in short: a default system prompt when the conversation has none.
DEFAULT_SYSTEM_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nBe brief.<|im_end|>\n' }}{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
USER = [{"role": "user", "content": "What is 2 + 2?"}]
TOOL = [{"role": "tool", "content": "4"}]


def with_template(tok, template):
    tok = copy.deepcopy(tok)
    tok.chat_template = template
    return tok


@pytest.mark.parametrize("template", [None, DEFAULT_SYSTEM_TEMPLATE])
@pytest.mark.parametrize("action_text", ["<calc>2+2</calc>", "It is 4.<|im_end|>"])
def test_the_history_decodes_to_the_template_rendering_of_the_conversation(tok, template, action_text):
    """Independent oracle: the template rendering the whole conversation as text."""
    tok = with_template(tok, template) if template else tok
    prompt = render_prompt(tok, USER)
    action = tok.encode(action_text, add_special_tokens=False)
    history = prompt + action + message_tokens(tok, USER, TOOL, action_tokens=action)
    content = action_text.removesuffix("<|im_end|>")
    conversation = [*USER, {"role": "assistant", "content": content}, *TOOL]
    assert tok.decode(history) == tok.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)


def test_the_closing_token_is_not_written_twice(tok):
    closed = tok.encode("4<|im_end|>", add_special_tokens=False)
    open_ = tok.encode("4", add_special_tokens=False)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert message_tokens(tok, USER, TOOL, action_tokens=open_) == [im_end] + message_tokens(
        tok, USER, TOOL, action_tokens=closed
    )


def test_templates_it_cannot_use_are_errors(tok):
    with pytest.raises(TrinityError, match="has no chat template"):
        message_tokens(with_template(tok, None), USER, TOOL, action_tokens=[5])
    upper = "{% for m in messages %}{{ m['content'] | lower }}{% endfor %}"
    with pytest.raises(TrinityError, match="does not write an assistant message's content verbatim"):
        message_tokens(with_template(tok, upper), USER, TOOL, action_tokens=[5])
    with pytest.raises(TrinityError, match="no new messages"):
        message_tokens(tok, USER, [], action_tokens=[5])
