"""message_tokens: the chat template's tokens for new messages, appended after an action."""

from __future__ import annotations

import copy

import pytest

from trinity_like.envs.chat import message_tokens
from trinity_like.errors import TrinityError
from trinity_like.models.resolve import render_prompt

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
