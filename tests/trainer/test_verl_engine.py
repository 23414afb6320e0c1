"""The verl engine (2 FSDP2 workers over gloo, through Ray) against the local engine.

THE PARITY TEST: the same loss on the same batch from the same weights gives the same
updated weights on both engines after two optimiser steps. Tolerance (fp32): the weight
difference between the engines is below 1e-3 of the update's norm (measured: 9e-6;
the gradients agree to ~1e-6 relative, they differ only in summation order, 2 ranks x
2 micro-batches against 3-row micro-batches), and every weight is within 1e-5 absolute,
1 % of one step at lr 1e-3. The element-wise bound cannot be much tighter: Adam divides by
sqrt(v) + eps, so on entries whose gradient is near eps, rounding noise in the gradient
moves the step by a visible fraction of lr (measured up to 1e-6 here).
"""

from __future__ import annotations

import os

import pytest
import ray
import ray.cloudpickle
import torch
from _lib import metric_invariance, trainer_batches
from _lib.trainer_batches import ClippedPPOLoss, make_batch, nll_loss, value_mse_loss

from trinity_like.cpu_share import EXPLORER, CoreShare
from trinity_like.errors import TrinityError
from trinity_like.models.tiny import build_tiny_model
from trinity_like.trainer.base import with_normalisers
from trinity_like.trainer.local_engine import LocalEngine
from trinity_like.trainer.lora import LoraParams
from trinity_like.trainer.params import AdamStep, ModelParams, OptimParams
from trinity_like.trainer.verl_engine import VerlEngine, VerlParams, start_ray

pytestmark = pytest.mark.slow

B, P, R = 8, 6, 5
# Warmup 1: the first step has lr 0 (moments only), the second lr 1e-3; clipping at 0.05 is active.
OPTIM = OptimParams(lr=1e-3, warmup_steps=1, weight_decay=0.01, eps=1e-6, grad_clip=0.05)

# The loss callables live in test modules that Ray workers cannot import: ship them by value.
ray.cloudpickle.register_pickle_by_value(trainer_batches)
ray.cloudpickle.register_pickle_by_value(metric_invariance)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=3))


@pytest.fixture(scope="module")
def batch() -> dict[str, torch.Tensor]:
    return make_batch(400, B, P, R, seed=11)


@pytest.fixture(scope="module")
def engine(tiny_path):
    eng = VerlEngine(
        # 4 logical CPUs: the actor's 2 workers and, later, the critic's 2 (on 2 real cores)
        ModelParams(path=tiny_path, micro_batch_size=2),
        OPTIM,
        VerlParams(num_workers=2, num_cpus=4),
    )
    yield eng
    eng.close()


def test_unreachable_ray_address_is_one_clear_error():
    if ray.is_initialized():
        pytest.skip("Ray already running in this process")
    with pytest.raises(TrinityError, match="cannot reach the Ray cluster at '127.0.0.1:1'"):
        start_ray(VerlParams(ray_address="127.0.0.1:1"))


def test_too_few_free_cpus_is_a_clear_error_not_a_hang(engine, tiny_path):
    with pytest.raises(TrinityError, match="free CPU for 3 verl workers"):  # 4 logical CPUs, 2 taken
        VerlEngine(ModelParams(path=tiny_path), OPTIM, VerlParams(num_workers=3))


def test_logprobs_and_entropy_match_the_local_engine(engine, tiny_path, batch):
    ours = engine.compute_logprobs(batch, need_entropy=True)
    local = LocalEngine(ModelParams(path=tiny_path)).compute_logprobs(batch, need_entropy=True)
    attended = batch["attention_mask"][:, P:].bool()
    for key in ("logprob", "entropy"):
        torch.testing.assert_close(ours[key][attended], local[key][attended], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("correction", ["seq_mis", "icepop"])
def test_a_rollout_correction_runs_in_the_verl_workers_as_in_the_local_engine(engine, tiny_path, batch, correction):
    """The objective (ppo + a rollout correction) is shipped to the workers, which compute the
    correction there: the same loss as the local engine, not the uncorrected one. Runs before any
    step, and leaves no gradient behind."""
    from algorithms.losses.ppo import PPOParams
    from algorithms.rollout_correction import BandParams, CapParams
    from trinity_like.trainer.objective import ComponentSpec, Objective

    params = CapParams(cap=1.5) if correction == "seq_mis" else BandParams(lower=0.8, upper=1.25)
    objective = Objective(
        policy_loss=ComponentSpec("POLICY_LOSS_FN", "ppo", PPOParams()),
        rollout_correction=ComponentSpec("ROLLOUT_CORRECTION", correction, params),
    )
    g = torch.Generator().manual_seed(4)
    gapped = {**batch, "rollout_logprob": batch["old_logprob"] + 0.3 * torch.randn(B, R, generator=g)}
    local = LocalEngine(ModelParams(path=tiny_path, micro_batch_size=2), OPTIM)
    m_verl = engine.forward_backward(gapped, objective)
    m_local = local.forward_backward(gapped, objective)
    engine.zero_grad()
    local.zero_grad()
    plain = local.forward_backward(gapped, Objective(policy_loss=objective.policy_loss))["loss"]
    key = "rollout_corr/masked_seq_frac" if correction == "seq_mis" else "rollout_corr/masked_token_frac"
    # A fraction is averaged over micro-batches, whose split differs between the engines; the
    # loss is normalised over the whole batch, so it does not depend on the split.
    assert 0 < m_local[key] < 1 and 0 < m_verl[key] < 1  # computed in the workers: masked some, not all
    assert m_verl["loss"] == pytest.approx(m_local["loss"], rel=1e-5)
    assert abs(m_local["loss"] - plain) > 1e-3 * abs(plain)  # and the correction changed the loss


def test_every_loss_logs_what_the_local_engines_single_micro_batch_logs(engine, tiny_path):
    """tests/trainer/test_metric_invariance.py on verl: every loss's logged metrics, 2 workers x 4
    micro-batches of 2 rows against the local engine's 1 micro-batch of 16 rows. On this module's engine
    before its first step (forward/backward and zero_grad only): the tiny model's weights on both."""
    one = LocalEngine(ModelParams(path=tiny_path, micro_batch_size=metric_invariance.B))
    for layout, batch in metric_invariance.batches_of(one).items():
        for name in metric_invariance.LOSSES:
            whole, sharded = metric_invariance.run(one, name, batch), metric_invariance.run(engine, name, batch)
            assert whole.keys() == sharded.keys(), (name, layout)
            keys = metric_invariance.objective_keys(whole, layout)
            # the engines' logprobs agree to ~1e-6 (the parity test below)
            metric_invariance.assert_same(sharded, whole, keys, rel=1e-4, abs_=1e-5, what=(name, layout))


def test_parity_same_loss_same_batch_same_updated_weights(engine, tiny_path, batch):
    local = LocalEngine(ModelParams(path=tiny_path, micro_batch_size=3), OPTIM)
    start = local.state_dict()
    loss_fn = ClippedPPOLoss(clip=0.2, entropy_coef=0.01)
    for step in range(2):
        m_verl = engine.forward_backward(batch, loss_fn, need_entropy=True)
        m_local = local.forward_backward(batch, loss_fn, need_entropy=True)
        assert m_verl["loss"] == pytest.approx(m_local["loss"], rel=1e-5)
        assert m_verl["clipfrac"] == pytest.approx(m_local["clipfrac"])
        s_verl, s_local = engine.optim_step(), local.optim_step()
        assert s_verl["lr"] == pytest.approx(s_local["lr"]) == pytest.approx(1e-3 * step)
        assert s_verl["grad_norm"] == pytest.approx(s_local["grad_norm"], rel=1e-5)
        assert s_local["grad_norm"] > OPTIM.grad_clip  # clipping is part of what is compared
    ours, theirs = engine.state_dict(), local.state_dict()
    assert ours.keys() == theirs.keys()
    moved = max(float((theirs[k] - start[k]).abs().max()) for k in theirs)
    assert moved > 1e-4  # the weights really moved (about lr per entry)
    worst = max(float((ours[k] - theirs[k]).abs().max()) for k in theirs)
    diff = torch.cat([(ours[k] - theirs[k]).flatten() for k in theirs])
    update = torch.cat([(theirs[k] - start[k]).flatten() for k in theirs])
    relative = float(diff.norm() / update.norm())
    print(f"parity: max |update| {moved:.3g}, max |verl - local| {worst:.3g}, relative {relative:.3g}")
    assert relative < 1e-3
    for name in theirs:
        torch.testing.assert_close(ours[name], theirs[name], rtol=0, atol=1e-5)


def test_save_is_a_transformers_folder_and_load_resumes_exactly(engine, batch, tmp_path):
    engine.save(str(tmp_path / "ckpt"))
    saved = engine.state_dict()
    reloaded = LocalEngine(ModelParams(path=str(tmp_path / "ckpt"))).state_dict()  # AutoModelForCausalLM
    assert all(torch.equal(reloaded[k], saved[k]) for k in saved)

    engine.forward_backward(batch, nll_loss)
    engine.optim_step()
    after_first = engine.state_dict()
    engine.load(str(tmp_path / "ckpt"))
    assert all(torch.equal(engine.state_dict()[k], saved[k]) for k in saved)
    engine.forward_backward(batch, nll_loss)
    engine.optim_step()  # same weights, moments and lr schedule position -> the same step
    after_second = engine.state_dict()
    for name in saved:
        torch.testing.assert_close(after_second[name], after_first[name], rtol=0, atol=1e-7)


def test_critic_values_and_step_match_the_local_engine(engine, tiny_path, batch, tmp_path):
    """A critic (verl's value-model engine) from a folder the local engine wrote: same values, same step."""
    LocalEngine(ModelParams(path=tiny_path, kind="value", head_seed=5)).save(str(tmp_path / "critic"))
    critic_params = ModelParams(path=str(tmp_path / "critic"), kind="value", micro_batch_size=2)
    critic = VerlEngine(critic_params, OPTIM, VerlParams(num_workers=2))  # joins the running Ray
    try:
        local = LocalEngine(ModelParams(path=str(tmp_path / "critic"), kind="value", micro_batch_size=3), OPTIM)
        attended = batch["attention_mask"][:, P:].bool()
        ours, theirs = critic.compute_logprobs(batch)["values"], local.compute_logprobs(batch)["values"]
        torch.testing.assert_close(ours[attended], theirs[attended], rtol=1e-5, atol=1e-5)
        for _ in range(2):
            assert critic.forward_backward(batch, value_mse_loss)["loss"] == pytest.approx(
                local.forward_backward(batch, value_mse_loss)["loss"], rel=1e-5
            )
            assert critic.optim_step()["grad_norm"] == pytest.approx(local.optim_step()["grad_norm"], rel=1e-5)
        ours, theirs = critic.state_dict(), local.state_dict()
        assert ours.keys() == theirs.keys()
        for name in theirs:
            torch.testing.assert_close(ours[name], theirs[name], rtol=0, atol=1e-5)
    finally:
        critic.close()


def test_gradients_accumulate_over_forward_backward_calls(engine, batch, tmp_path):
    """verl: two calls on row blocks carrying the full batch's normalisers, one step == local, one call."""
    engine.save(str(tmp_path / "now"))
    local = LocalEngine(ModelParams(path=str(tmp_path / "now"), micro_batch_size=8), OPTIM)
    local.load(str(tmp_path / "now"))
    local.forward_backward(batch, nll_loss)
    full = with_normalisers(batch)
    for rows in (slice(0, 2), slice(2, B)):
        engine.forward_backward({k: v if v.dim() == 0 else v[rows] for k, v in full.items()}, nll_loss)
    assert engine.optim_step()["grad_norm"] == pytest.approx(local.optim_step()["grad_norm"], rel=1e-5)
    ours, theirs = engine.state_dict(), local.state_dict()
    for name in theirs:
        torch.testing.assert_close(ours[name], theirs[name], rtol=0, atol=1e-5)


def test_checkpoints_resume_across_engines(engine, tiny_path, batch, tmp_path):
    """local -> verl -> local: weights, AdamW moments and the lr schedule's position carry over."""
    loss_fn = ClippedPPOLoss(clip=0.2)
    local = LocalEngine(ModelParams(path=tiny_path, micro_batch_size=3), OPTIM)
    for _ in range(2):
        local.forward_backward(batch, loss_fn)
        local.optim_step()
    local.save(str(tmp_path / "from_local"))
    engine.load(str(tmp_path / "from_local"))
    before = local.state_dict()
    assert all(torch.equal(engine.state_dict()[k], before[k]) for k in before)

    for eng in (engine, local):
        eng.forward_backward(batch, loss_fn)
        assert eng.optim_step()["lr"] == pytest.approx(1e-3)
    engine.save(str(tmp_path / "from_verl"))
    resumed = LocalEngine(ModelParams(path=tiny_path, micro_batch_size=3), OPTIM)
    resumed.load(str(tmp_path / "from_verl"))
    for eng in (resumed, local):
        eng.forward_backward(batch, loss_fn)
        eng.optim_step()
    ours, theirs = resumed.state_dict(), local.state_dict()
    diff = torch.cat([(ours[k] - theirs[k]).flatten() for k in theirs])
    update = torch.cat([(theirs[k] - before[k]).flatten() for k in theirs])
    assert float(diff.norm() / update.norm()) < 1e-3
    for name in theirs:
        torch.testing.assert_close(ours[name], theirs[name], rtol=0, atol=1e-5)


def test_outputs_of_the_training_pass_and_a_per_step_adam_match_the_local_engine(engine, batch, tmp_path):
    """The client's path: ``forward_backward(out=...)`` returns the logprobs the loss saw, and
    ``optim_step(AdamStep)`` steps at the caller's own lr / betas / clip on both engines."""
    engine.save(str(tmp_path / "now"))
    local = LocalEngine(ModelParams(path=str(tmp_path / "now"), micro_batch_size=3), OPTIM)
    local.load(str(tmp_path / "now"))
    expected = local.compute_logprobs(batch)["logprob"]
    # eps 1e-6 as OPTIM (module docstring): at 1e-8 an entry whose gradient is rounding noise moved by 4e-5
    adam = AdamStep(lr=2e-3, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.0, grad_clip=0.0)
    outs = [{}, {}]
    for eng, out in zip((engine, local), outs, strict=True):
        eng.forward_backward(batch, nll_loss, out=out)
        assert eng.optim_step(adam)["lr"] == pytest.approx(2e-3)
    attended = batch["attention_mask"][:, P:].bool()
    for out in outs:
        assert out["logprob"].shape == (B, R)
        torch.testing.assert_close(out["logprob"][attended], expected[attended], rtol=1e-5, atol=1e-5)
    ours, theirs = engine.state_dict(), local.state_dict()
    for name in theirs:
        torch.testing.assert_close(ours[name], theirs[name], rtol=0, atol=1e-5)


def test_lora_parity_weight_sync_and_checkpoints_across_engines(engine, tiny_path, batch, tmp_path):
    """LoRA on verl's peft model: the same seeded adapter as the local engine, the same
    merged weights after two steps (same tolerances as the full parity test), merged full
    weights for weight sync (the tied output layer included: the adapter unties it), and
    adapter checkpoints that resume on the other engine."""
    lora = LoraParams(rank=4, alpha=8.0, seed=7)
    verl = VerlEngine(ModelParams(path=tiny_path, micro_batch_size=2, lora=lora), OPTIM, VerlParams(num_workers=2))
    try:
        local = LocalEngine(ModelParams(path=tiny_path, micro_batch_size=3, lora=lora), OPTIM)
        start = local.state_dict()
        ours = verl.state_dict()
        assert ours.keys() == start.keys() and all(torch.equal(ours[k], start[k]) for k in start)  # B = 0 on both
        loss_fn = ClippedPPOLoss(clip=0.2, entropy_coef=0.01)
        for _ in range(2):
            m_verl = verl.forward_backward(batch, loss_fn, need_entropy=True)
            assert m_verl["loss"] == pytest.approx(
                local.forward_backward(batch, loss_fn, need_entropy=True)["loss"], rel=1e-5
            )
            assert verl.optim_step()["grad_norm"] == pytest.approx(local.optim_step()["grad_norm"], rel=1e-5)
        ours, theirs = verl.state_dict(), local.state_dict()
        update = torch.cat([(theirs[k] - start[k]).flatten() for k in theirs])
        diff = torch.cat([(ours[k] - theirs[k]).flatten() for k in theirs])
        assert float(update.abs().max()) > 1e-4 and float(diff.norm() / update.norm()) < 1e-3
        for name in theirs:
            torch.testing.assert_close(ours[name], theirs[name], rtol=0, atol=1e-5)
        assert torch.equal(ours["model.embed_tokens.weight"], start["model.embed_tokens.weight"])  # base frozen

        synced = verl.export_weights().tensors()
        assert synced.keys() == ours.keys() and all(torch.equal(synced[k], ours[k]) for k in ours)
        assert not torch.equal(synced["lm_head.weight"], synced["model.embed_tokens.weight"])

        verl.save(str(tmp_path / "from_verl"))
        assert (tmp_path / "from_verl" / "adapter_model.safetensors").is_file()
        resumed = LocalEngine(ModelParams(path=tiny_path, micro_batch_size=3, lora=lora), OPTIM)
        resumed.load(str(tmp_path / "from_verl"))
        assert resumed.step == 2 and all(torch.equal(resumed.state_dict()[k], ours[k]) for k in ours)
        local.save(str(tmp_path / "from_local"))
        verl.load(str(tmp_path / "from_local"))
        assert all(torch.equal(verl.state_dict()[k], theirs[k]) for k in theirs)
        for eng in (verl, local, resumed):
            eng.forward_backward(batch, loss_fn, need_entropy=True)
            assert eng.optim_step()["lr"] == pytest.approx(1e-3)
        after = [eng.state_dict() for eng in (verl, local, resumed)]
        for name in theirs:
            torch.testing.assert_close(after[0][name], after[1][name], rtol=0, atol=1e-5)
            torch.testing.assert_close(after[2][name], after[1][name], rtol=0, atol=1e-5)
        with pytest.raises(TrinityError, match="does not exist"):
            verl.load(str(tmp_path / "missing"))
        engine.save(str(tmp_path / "full"))
        with pytest.raises(TrinityError, match="holds full weights, not a LoRA adapter"):
            verl.load(str(tmp_path / "full"))
        with pytest.raises(TrinityError, match="holds a LoRA adapter"):
            engine.load(str(tmp_path / "from_local"))
    finally:
        verl.close()


def test_a_worker_takes_the_threads_it_is_given(engine, tiny_path, batch):
    """``VerlParams.threads`` (a recipe's ``cluster.trainer_threads``) is what torch uses in the
    worker, and without it each of the module engine's 2 workers takes its share of the cores;
    with a board shared with the explorer (trinity_like/cpu_share.py) a micro-batch runs at the
    trainer's share while the explorer computes and at its full width when it does not."""
    assert engine._call("trinity_threads", "test") == [max(1, (os.cpu_count() or 1) // 2)] * 2
    cores = CoreShare.create(share=(1, 2), wide=(4, 3))
    one = VerlEngine(
        ModelParams(path=tiny_path, micro_batch_size=2), OPTIM, VerlParams(num_workers=1, threads=4, cores=cores)
    )  # joins the running Ray
    try:
        assert one._call("trinity_threads", "test") == [4]
        with cores.computing(EXPLORER):
            one.forward_backward(batch, nll_loss)
        assert one._call("trinity_threads", "test") == [2]
        one.forward_backward(batch, nll_loss)
        assert one._call("trinity_threads", "test") == [3]
    finally:
        one.close()
        cores.close()
