"""The tiny test model and tokenizer: deterministic, offline, and a normal HF folder."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from trinity_like.models.tiny import build_tiny_model, build_tiny_tokenizer

TEXTS = ["What is 23 + 5? Answer with just the number.", "é 漢字 \\boxed{12}\n\n<|im_end|>"]


def test_tokenizer_special_tokens_and_chat_template():
    tok = build_tiny_tokenizer()
    assert tok.pad_token == tok.eos_token == "<|im_end|>"
    assert tok.convert_tokens_to_ids("<|im_start|>") != tok.unk_token_id
    text = tok.apply_chat_template(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    for t in TEXTS:
        assert tok.decode(tok.encode(t)) == t
    assert 300 <= len(tok) <= 420


def test_model_deterministic_per_seed():
    a, _ = build_tiny_model(seed=0)
    b, _ = build_tiny_model(seed=0)
    c, _ = build_tiny_model(seed=1)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)


def test_saved_folder_reloads_identically(tmp_path):
    model, tok = build_tiny_model(seed=3)
    path = build_tiny_model(tmp_path / "tiny", seed=3)
    assert (path / "model.safetensors").exists()
    tok2 = AutoTokenizer.from_pretrained(path)
    model2 = AutoModelForCausalLM.from_pretrained(path)
    for t in TEXTS:
        assert tok2.encode(t) == tok.encode(t)
    assert tok2.pad_token_id == tok.pad_token_id and tok2.eos_token_id == tok.eos_token_id
    ids = torch.tensor([tok.encode(TEXTS[0])])
    with torch.no_grad():
        torch.testing.assert_close(model2(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)
