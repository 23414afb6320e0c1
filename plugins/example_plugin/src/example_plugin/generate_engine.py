"""A second rollout engine, ``hf_generate``: ``transformers``' own ``generate`` behind trinity-like's
rollout-engine contract -- the example of a plugin engine (a vLLM or SGLang one is built the same
way) and the peer our ``native`` engine is measured against.

``explorer.engine: hf_generate`` in a recipe (with this plugin loaded) makes the explorer, and
``build_rollout_engine("hf_generate", path)`` anyone else, sample through it. An engine writes
``run`` (the contract's ``generate`` helper is built on it for every engine). What the contract
asks and how ``generate`` gives it:

- one sample per seed, a sample's tokens a function of its seed: every sample is its own row
  (``generate`` prefills each copy of a prompt), and a logits processor draws row r's token i
  from ``uniforms(seed_r, i)`` with the same inverse-CDF sampler the native engine uses, then
  leaves ``generate`` only that token to pick (greedy over a one-hot). The same seeds give the
  same tokens as the native engine, up to float rounding of the logits;
- per-token logprobs under the sampling distribution: recorded by the same processor;
- stop tokens (``eos_token_id``), stop strings (``stop_strings`` with the tokenizer), the cap;
- ``update_weights``: a state dict or ``(name, tensor)`` pairs (``weight_mapping``), copied in (a
  :class:`Borrowed` too: this engine never borrows).

Example::

    engine = build_rollout_engine("hf_generate", "tiny-random", device="cpu")
    groups = generate(engine, [prompt_ids], SamplingParams(n=4, max_new_tokens=16, seed=1))
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from trinity_like.errors import TrinityError
from trinity_like.explorer.engine_contract import (
    Borrowed,
    EngineSpec,
    Request,
    Sample,
    SamplingParams,
    Weights,
    weight_mapping,
)
from trinity_like.explorer.sampling import greedy_tokens, sample_tokens, seed_bits, uniforms
from trinity_like.models.weight_digest import model_digest
from trinity_like.registry import ROLLOUT_ENGINE


class _Draw:
    """A ``generate`` logits processor: each row's token from its own seeded stream, its logprob kept."""

    def __init__(self, seeds_R: torch.Tensor, prompt_width: int, sampling: SamplingParams, pace=None) -> None:
        self.seeds_R, self.width, self.sampling, self.pace = seeds_R, prompt_width, sampling, pace
        self.tokens: list[torch.Tensor] = []  # [R] per step
        self.logprobs: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        sp = self.sampling
        if self.pace is not None:  # between decode steps: the engine's pace (the explorer's CPU share)
            self.pace()
        if sp.greedy:
            token_R, logprob_R = greedy_tokens(scores)
        else:
            draws_R = torch.full_like(self.seeds_R, input_ids.shape[1] - self.width)
            token_R, logprob_R = sample_tokens(
                scores, uniforms(self.seeds_R, draws_R), temperature=sp.temperature, top_k=sp.top_k, top_p=sp.top_p
            )
        self.tokens.append(token_R)
        self.logprobs.append(logprob_R.float())
        picked = torch.full_like(scores, float("-inf"))
        return picked.scatter_(1, token_R[:, None], 0.0)  # generate's own choice is now ours


@ROLLOUT_ENGINE.register_module("hf_generate")
class GenerateEngine:
    """transformers' generate as a rollout engine (example plugin): per-seed sampling, logprobs, stops."""

    def __init__(self, spec: EngineSpec) -> None:
        from trinity_like.models.resolve import load_model

        model, tokenizer = load_model(spec.model_path, dtype=spec.dtype)
        self._hold(model.to(spec.device), tokenizer)

    @classmethod
    def over(cls, model, tokenizer) -> GenerateEngine:
        """An engine over a model already loaded (the rollout benchmark shares one with its other contenders)."""
        engine = cls.__new__(cls)
        engine._hold(model, tokenizer)
        return engine

    def _hold(self, model, tokenizer) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.model_version = 0
        self.pace = None  # called before each decode step when the explorer sets it
        self.weights_digest = model_digest(self.model)  # what each sample names its weights by
        eos = self.model.generation_config.eos_token_id
        ids = {eos} if isinstance(eos, int) else set(eos or ())
        if tokenizer.eos_token_id is not None:
            ids.add(tokenizer.eos_token_id)
        self.default_stop_ids = tuple(sorted(int(i) for i in ids))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.default_stop_ids[0]

    def run(self, requests: Sequence[Request], sampling: SamplingParams) -> list[list[Sample]]:
        rows = [(r, s) for r, req in enumerate(requests) for s in range(len(req.seeds))]
        if not rows:
            return [[] for _ in requests]
        if any(not req.prompt_ids for req in requests):
            raise TrinityError("hf_generate: empty prompt")
        device = self.model.device
        width = max(len(req.prompt_ids) for req in requests)
        prompts = [requests[r].prompt_ids for r, _ in rows]
        ids = torch.tensor([[self.pad_id] * (width - len(p)) + list(p) for p in prompts], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        seeds = torch.tensor([seed_bits(requests[r].seeds[s]) for r, s in rows], device=device)
        from transformers import GenerationConfig, LogitsProcessorList

        stop_ids = list(sampling.stop_token_ids if sampling.stop_token_ids is not None else self.default_stop_ids)
        draw = _Draw(seeds, width, sampling, self.pace)
        # A config of our own, not the model's defaults: no stop token means none (not the model's eos),
        # and no warper of the model's (top-k 50, ...) touches the scores before ours.
        config = GenerationConfig(
            do_sample=False,
            max_new_tokens=sampling.max_new_tokens,
            eos_token_id=stop_ids or None,
            pad_token_id=self.pad_id,
            stop_strings=list(sampling.stop_strings) or None,
        )
        saved, self.model.generation_config = self.model.generation_config, config
        try:
            with torch.inference_mode():
                self.model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    logits_processor=LogitsProcessorList([draw]),
                    tokenizer=self.tokenizer if sampling.stop_strings else None,
                )
        finally:
            self.model.generation_config = saved
        tokens_RN = torch.stack(draw.tokens, dim=1).tolist()
        logprobs_RN = torch.stack(draw.logprobs, dim=1).tolist()
        out: list[list[Sample]] = [[] for _ in requests]
        for (r, s), toks, lps in zip(rows, tokens_RN, logprobs_RN):
            n, reason = self._length(toks, set(stop_ids), sampling)
            out[r].append(Sample(r, s, toks[:n], lps[:n], reason, self.model_version, self.weights_digest))
        return out

    def _length(self, tokens: list[int], stop_ids: set[int], sampling: SamplingParams) -> tuple[int, str]:
        """Tokens of a row up to its finish, and why it finished (what generate stopped it for)."""
        window = max((len(s.encode()) for s in sampling.stop_strings), default=0) + 1  # a token is >= 1 byte
        for i, token in enumerate(tokens):
            if token in stop_ids:
                return i + 1, "stop"
            if sampling.stop_strings:
                tail = self.tokenizer.decode(tokens[max(0, i + 1 - window) : i + 1])
                if any(stop in tail for stop in sampling.stop_strings):
                    return i + 1, "stop"
        return len(tokens), "length"

    def update_weights(self, weights: Weights | Borrowed, *, version: int | None = None, strict: bool = True) -> int:
        state, _ = weight_mapping(weights)  # a mapping or (name, tensor) pairs; borrowed ones are copied in too
        with torch.no_grad():
            result = self.model.load_state_dict(dict(state), strict=False)
        tied = {"lm_head.weight"} if self.model.config.tie_word_embeddings else set()
        missing = set(result.missing_keys) - tied
        if strict and (missing or result.unexpected_keys):
            raise TrinityError(f"hf_generate: missing {sorted(missing)}, unexpected {result.unexpected_keys}")
        self.model_version = self.model_version + 1 if version is None else int(version)
        self.weights_digest = model_digest(self.model)
        return self.model_version

    def release_memory(self) -> None:
        if self.model.device.type == "cuda":
            torch.cuda.empty_cache()

    def resume_memory(self) -> None:
        """generate allocates its cache per call."""

    def close(self) -> None:
        self.release_memory()
        self.model = None
