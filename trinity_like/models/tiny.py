"""Tiny, deterministic models and tokenizers for tests, built in-process and offline.

No test may download weights, and the real small model takes seconds per step on CPU, so
tests run on a random ``Qwen2ForCausalLM`` of about 0.1 M parameters over a byte-level BPE
of a few hundred tokens trained here in well under a second. Both are deterministic: the
tokenizer's training text is fixed, the model's weights come from a seeded generator.

Example::

    model, tok = build_tiny_model(seed=0)
    folder = build_tiny_model(tmp_path / "tiny")     # a normal Hugging Face folder
    AutoModelForCausalLM.from_pretrained(folder)       # loads like any other model
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

# ChatML, the format of Qwen and SmolLM2; `add_generation_prompt` opens the assistant turn.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen2's pre-tokenizer split (digits one by one). The saved folder says `model_type:
# qwen2`, so `AutoTokenizer` reloads it as `Qwen2Tokenizer`, which rebuilds this exact
# pipeline around our vocabulary and merges: encodings survive the round trip.
QWEN2_SPLIT_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

_WORDS = (
    "zero one two three four five six seven eight nine ten eleven twelve twenty thirty "
    "forty fifty hundred thousand plus minus times divided by equals sum difference "
    "product quotient add subtract multiply divide number answer question what is the "
    "of and result total calculate compute reply with only final just you are a calculator "
    "system user assistant please boxed step think so therefore because first then next "
    "The capital of France is Paris. Hello world! Yes no true false."
)


def _training_text() -> list[str]:
    """A fixed corpus: words, digits and little sums, so numbers get short encodings."""
    lines = [_WORDS] * 4
    for a in range(0, 100, 7):
        for b in range(0, 10, 3):
            lines.append(f"What is {a} + {b}? {a} + {b} = {a + b}. {a} - {b} = {a - b}. {a} * {b} = {a * b}.")
    lines.append("0123456789 +-*/=()[]{}.,;:!?\\boxed{42} $x^2$ \n\t")
    return lines


@functools.cache
def _trained_tokenizer_json(vocab_size: int) -> str:
    """Train the BPE once per process and size; the JSON is immutable so it caches safely."""
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_text(), trainer=trainer)
    return tok.to_str()


def build_tiny_tokenizer(vocab_size: int = 400) -> PreTrainedTokenizerFast:
    """A byte-level BPE of ``vocab_size`` tokens with a ChatML template; pad = eos = ``<|im_end|>``.

    Byte-level, so every string encodes (no unknown token). Returns a fresh object each
    call (callers may mutate it); the training itself is cached within the process.
    """
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_trained_tokenizer_json(vocab_size)),
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>", "<|endoftext|>"],
        clean_up_tokenization_spaces=False,
        padding_side="left",  # decoder-only batches are padded on the left
    )
    tok.chat_template = CHATML_TEMPLATE
    return tok


def tiny_config(
    vocab_size: int,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
) -> Qwen2Config:
    """The Qwen2 config of the tiny test model: grouped-query attention, tied embeddings."""
    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        bos_token_id=None,
    )


def build_tiny_model(
    path: str | Path | None = None,
    seed: int = 0,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    vocab_size: int = 400,
    init_std: float = 0.5,
) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast] | Path:
    """A random tiny ``Qwen2ForCausalLM`` and its tokenizer, identical for the same seed.

    ``init_std`` is larger than the usual 0.02 so the random model's next-token
    distribution is peaked and varied rather than near-uniform: greedy decoding then hits
    stop tokens and ties are vanishingly rare, which the equivalence tests rely on.
    With ``path``, the model (safetensors) and tokenizer are saved there as a normal
    Hugging Face folder and the path is returned; otherwise ``(model, tokenizer)``.
    """
    tok = build_tiny_tokenizer(vocab_size)
    config = tiny_config(
        len(tok),
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    config.initializer_range = init_std
    # Seed a private generator state: the caller's global RNG is left as it was.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.eval()
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.bos_token_id = None
    if path is None:
        return model, tok
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    copy.copy(tok).save_pretrained(path)
    return path
