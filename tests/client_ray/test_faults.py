"""Processes killed mid-run: a sampler (SIGKILL) is restarted and its requests retried, with
nothing lost or trained twice; a dead learner is a one-line error that says how to resume.

Oracle for the sampler kill: the same loop in-process (one torch thread on both sides). The
loop trains cross-entropy on the sampled tokens, whose loss does not depend on the sampler's
logprobs, so a datum missing or counted twice would change a step's loss: equal losses at
every step mean every datum was trained exactly once.
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

import trinity_like.client as tinker
from trinity_like.client.ray import Bundle, RayClientConfig, wait_all
from trinity_like.errors import TrinityError

types = tinker.types
STEPS, PROMPTS, GROUP = 4, 6, 2


def rl_like_loop(service, *, kill_at: int | None = None):
    """STEPS iterations: sample PROMPTS groups, train on every sample, take a step. Returns
    (step ids, loss per step, tokens per step); at iteration ``kill_at`` sampler 0 is
    SIGKILLed while its requests run."""
    training = service.create_lora_training_client("tiny-random", rank=0, seed=0)
    tok = training.get_tokenizer()
    prompts = [types.ModelInput.from_ints(tok.encode(f"What is {i} + {i}?")) for i in range(PROMPTS)]
    steps, losses, tokens = [], [], []
    sampler = training.save_weights_and_get_sampling_client()
    for it in range(STEPS):
        futures = [
            sampler.sample(p, GROUP, types.SamplingParams(max_tokens=6, seed=100 * it + i, stop=[]))
            for i, p in enumerate(prompts)
        ]
        if it == kill_at:
            time.sleep(0.5)  # the first requests are running on both samplers
            os.kill(service.sampler_pool.pids()[0], signal.SIGKILL)
        groups = wait_all(futures, timeout=120)
        data = [
            types.Datum(
                model_input=p.append(types.EncodedTextChunk(tokens=s.tokens[:-1])),
                loss_fn_inputs={
                    "target_tokens": [0] * (p.length - 1) + s.tokens,
                    "weights": [0.0] * (p.length - 1) + [1.0] * len(s.tokens),
                },
            )
            for p, g in zip(prompts, groups, strict=True)
            for s in g.sequences
        ]
        fwd = training.forward_backward(data, "cross_entropy")
        training.optim_step(types.AdamParams(learning_rate=1e-2)).result(timeout=60)
        steps.append(getattr(training, "version", it + 1))
        losses.append(fwd.result().metrics["loss:sum"])
        tokens.append([s.tokens for g in groups for s in g.sequences])
        sampler = training.save_weights_and_get_sampling_client()
    training.close()
    return steps, losses, tokens


def test_a_killed_sampler_is_restarted_and_the_run_finishes_as_if_nothing_happened(ray_here, threads_one, tmp_path):
    with tinker.ServiceClient(log_dir=tmp_path / "local") as local:
        expected = rl_like_loop(local)
    config = RayClientConfig(samplers=(Bundle(), Bundle()), max_in_flight=2, sampler_delay_s=0.3)
    with tinker.ServiceClient(backend="ray", ray=config, log_dir=tmp_path / "ray") as service:
        before = service.sampler_pool.pids()
        steps, losses, tokens = rl_like_loop(service, kill_at=1)
        deadline = time.monotonic() + 120  # the other sampler may have finished the run before Ray restarted it
        while service.sampler_pool.stats()["restarts"] < 1 and time.monotonic() < deadline:
            time.sleep(0.5)
        stats = service.sampler_pool.stats()
        after = service.sampler_pool.pids()
    assert steps == [1, 2, 3, 4]  # monotonic step ids, one per iteration
    assert stats["restarts"] == 1 and stats["retried"] >= 1, stats
    assert after[0] != before[0] and after[1] == before[1]  # a new process for the killed one only
    assert tokens == expected[2]  # every request answered once, as it would have been
    assert losses == expected[1]  # every datum trained exactly once


def test_a_killed_learner_is_a_one_line_error_saying_how_to_resume(ray_here, tmp_path):
    config = RayClientConfig(samplers=(Bundle(CPU=0.5),))
    with tinker.ServiceClient(backend="ray", ray=config, log_dir=tmp_path) as service:
        training = service.create_lora_training_client("tiny-random", rank=0, seed=0)
        ids = training.get_tokenizer().encode("one two three")
        data = [
            types.Datum(
                model_input=types.ModelInput.from_ints(ids[:-1]),
                loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)},
            )
        ]
        adam = types.AdamParams(learning_rate=1e-2)
        training.forward_backward(data, "cross_entropy")
        training.optim_step(adam).result(timeout=60)
        path = training.save_state("step-1").result(timeout=60).path
        os.kill(training.learner_pid(), signal.SIGKILL)
        with pytest.raises(TrinityError) as err:
            training.forward_backward(data, "cross_entropy").result(timeout=60)
        message = str(err.value)
        assert "\n" not in message
        assert re.search(r"learner actor .* died", message)
        assert f"create_training_client_from_state_with_optimizer({path!r})" in message
        training.close()  # its bundle is free again: the resume goes there
        resumed = service.create_training_client_from_state_with_optimizer(path)
        resumed.forward_backward(data, "cross_entropy")
        assert resumed.optim_step(adam).result(timeout=60).metrics["grad_norm"] > 0
        resumed.close()

        unsaved = service.create_lora_training_client("tiny-random", rank=0, seed=0)
        os.kill(unsaved.learner_pid(), signal.SIGKILL)
        with pytest.raises(TrinityError, match="no save_state was taken by this client"):
            unsaved.optim_step(adam).result(timeout=60)
