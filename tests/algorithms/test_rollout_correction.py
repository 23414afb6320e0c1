"""Rollout corrections (algorithms/rollout_correction.py, registry ROLLOUT_CORRECTION) against their papers'
formulas written as plain Python loops, and the objective that applies them to any policy loss.

Oracle: for every row and token, rho = math.exp(old_logprob - rollout_logprob) in Python floats, then
the paper's rule token by token or row by row:

- token TIS (Yao et al. 2025): w_t = min(rho_t, C), every token kept;
- sequence TIS (Liu, Li et al. 2025): w = min(prod_t rho_t, C) on every token of the row;
- token MIS (Yao et al. 2025): w_t = rho_t, token kept iff rho_t <= C;
- sequence MIS: w = prod_t rho_t, row kept iff the product <= C;
- geometric-mean masking: row kept iff lower <= (prod_t rho_t)^(1/T) <= upper, w = 1;
- IcePop (arXiv:2510.18855): w_t = rho_t, token kept iff lower <= rho_t <= upper.
"""

from __future__ import annotations

import math

import pytest
import torch
from _lib.algo_testlib import DT, autograd_grad

from trinity_like.components import ComponentSpec, build_params, call_component
from trinity_like.errors import ConfigError
from trinity_like.registry import POLICY_LOSS_FN, ROLLOUT_CORRECTION
from trinity_like.trainer.objective import Objective

NAMES = ("token_tis", "seq_tis", "token_mis", "seq_mis", "geo_mask", "icepop")


def gap_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """Rows whose sampler drifts by very different amounts (0 to 1.5 nats per token), so that every
    rule both keeps and cuts something; right-padded masks of random lengths, one empty row."""
    g = torch.Generator().manual_seed(seed)
    scales = torch.tensor([0.0, 0.01, 0.03, 0.1, 0.3, 0.8, 1.5, 0.02, 0.5, 0.05], dtype=DT)
    B, R = len(scales), 9
    old = -torch.rand(B, R, generator=g, dtype=DT) * 3 - 0.05
    rollout = old + scales.unsqueeze(1) * torch.randn(B, R, generator=g, dtype=DT)
    lengths = torch.randint(1, R + 1, (B,), generator=g)
    lengths[3] = 0
    mask = (torch.arange(R).unsqueeze(0) < lengths.unsqueeze(1)).to(DT)
    return {"old_logprob": old, "rollout_logprob": rollout, "action_mask": mask}


def oracle(name: str, b: dict[str, torch.Tensor], p: dict[str, float]):
    """Weights and keep flags per token (Python lists), and the fraction of tokens or rows cut."""
    B, R = b["action_mask"].shape
    weights = [[1.0] * R for _ in range(B)]
    keep = [[0.0] * R for _ in range(B)]
    cut, counted = 0, 0
    for i in range(B):
        toks = [j for j in range(R) if b["action_mask"][i, j] > 0]
        rhos = {j: math.exp(float(b["old_logprob"][i, j]) - float(b["rollout_logprob"][i, j])) for j in toks}
        if not toks:
            continue
        if name in ("token_tis", "token_mis", "icepop"):
            for j in toks:
                r = rhos[j]
                if name == "token_tis":
                    weights[i][j], keep[i][j], out = min(r, p["cap"]), 1.0, r > p["cap"]
                elif name == "token_mis":
                    weights[i][j], keep[i][j], out = r, float(r <= p["cap"]), r > p["cap"]
                else:
                    out = not (p["lower"] <= r <= p["upper"])
                    weights[i][j], keep[i][j] = r, float(not out)
                cut, counted = cut + out, counted + 1
            continue
        prod = 1.0
        for j in toks:
            prod *= rhos[j]
        if name == "seq_tis":
            w, k, out = min(prod, p["cap"]), 1.0, prod > p["cap"]
        elif name == "seq_mis":
            w, k, out = prod, float(prod <= p["cap"]), prod > p["cap"]
        else:
            geo = prod ** (1.0 / len(toks))
            out = not (p["lower"] <= geo <= p["upper"])
            w, k = 1.0, float(not out)
        for j in toks:
            weights[i][j], keep[i][j] = w, k
        cut, counted = cut + out, counted + 1
    return weights, keep, cut / counted


DEFAULTS = {
    "token_tis": {"cap": 2.0},
    "seq_tis": {"cap": 2.0},
    "token_mis": {"cap": 2.0},
    "seq_mis": {"cap": 2.0},
    "geo_mask": {"lower": 0.95, "upper": 1.05},
    "icepop": {"lower": 0.5, "upper": 5.0},
}
OTHER = {
    "token_tis": {"cap": 1.3},
    "seq_tis": {"cap": 5.0},
    "token_mis": {"cap": 1.5},
    "seq_mis": {"cap": 1.2},
    "geo_mask": {"lower": 0.9, "upper": 1.01},
    "icepop": {"lower": 0.8, "upper": 1.5},
}
FRACTION = {
    "token_tis": "rollout_corr/truncated_token_frac",
    "seq_tis": "rollout_corr/truncated_seq_frac",
    "token_mis": "rollout_corr/masked_token_frac",
    "seq_mis": "rollout_corr/masked_seq_frac",
    "geo_mask": "rollout_corr/masked_seq_frac",
    "icepop": "rollout_corr/masked_token_frac",
}


def correct(name, batch, **params):
    fn = ROLLOUT_CORRECTION.get(name)
    return call_component(fn, batch, build_params(fn, params))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("which", ["defaults", "other"])
def test_each_correction_is_its_papers_formula(name, which):
    p = DEFAULTS[name] if which == "defaults" else OTHER[name]
    for seed in range(3):
        b = gap_batch(seed)
        weights, keep, frac = oracle(name, b, p)
        w, m, metrics = correct(name, b, **({} if which == "defaults" else p))
        assert w.shape == m.shape == b["action_mask"].shape and w.dtype == DT
        real = b["action_mask"] > 0
        assert torch.allclose(w[real], torch.tensor(weights, dtype=DT)[real], rtol=1e-9)
        assert torch.equal(m, torch.tensor(keep, dtype=DT))  # 0 on padding as well
        assert metrics[FRACTION[name]] == pytest.approx(frac, abs=1e-12)
        kept = [weights[i][j] for i in range(len(keep)) for j in range(len(keep[0])) if keep[i][j] > 0]
        assert metrics["rollout_corr/weight_mean"] == pytest.approx(sum(kept) / len(kept), rel=1e-9)


def test_the_test_batch_exercises_every_rule():
    """Every correction both keeps and cuts something at its defaults on the test batches (so the
    oracle comparison above covers both branches)."""
    for name in NAMES:
        fracs = [oracle(name, gap_batch(s), DEFAULTS[name])[2] for s in range(3)]
        assert max(fracs) > 0 and min(fracs) < 1, (name, fracs)


def test_no_gap_changes_nothing():
    b = gap_batch()
    b["rollout_logprob"] = b["old_logprob"].clone()
    for name in NAMES:
        w, m, metrics = correct(name, b)
        real = b["action_mask"] > 0
        assert torch.allclose(w[real], torch.ones_like(w[real])) and torch.equal(m, b["action_mask"])
        assert metrics[FRACTION[name]] == 0.0


@pytest.mark.parametrize(
    "name, bad",
    [("token_tis", {"cap": 0.0}), ("icepop", {"lower": 1.2}), ("geo_mask", {"upper": 0.99}), ("seq_mis", {"cpa": 2})],
)
def test_bad_params_are_errors(name, bad):
    with pytest.raises(ConfigError):
        build_params(ROLLOUT_CORRECTION.get(name), bad)


# -- the objective applies it to any policy loss ---------------------------------------------------------------
def loss_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    b = gap_batch(seed)
    g = torch.Generator().manual_seed(100 + seed)
    B, _ = b["action_mask"].shape
    b["logprob"] = b["old_logprob"] + 0.1 * torch.randn(b["old_logprob"].shape, generator=g, dtype=DT)
    b["advantages"] = torch.randn(b["old_logprob"].shape, generator=g, dtype=DT)
    b["is_expert"] = torch.zeros(B, dtype=torch.bool)
    return b


@pytest.mark.parametrize("loss_name", ["ppo", "cispo", "gspo", "importance_sampling"])
@pytest.mark.parametrize("name", NAMES)
def test_the_objective_hands_the_loss_weighted_advantages_and_masked_tokens(loss_name, name):
    """Objective(loss + correction) == the bare loss on advantages * w and action_mask * keep from the
    per-token oracle: value and gradient."""
    fn = POLICY_LOSS_FN.get(loss_name)
    params = build_params(fn, {})
    b = loss_batch(1)
    weights, keep, _ = oracle(name, b, DEFAULTS[name])
    inputs = {**b, "advantages": b["advantages"] * torch.tensor(weights, dtype=DT)}
    inputs["action_mask"] = torch.tensor(keep, dtype=DT)
    corr = ComponentSpec("ROLLOUT_CORRECTION", name, build_params(ROLLOUT_CORRECTION.get(name), {}))
    objective = Objective(policy_loss=ComponentSpec("POLICY_LOSS_FN", loss_name, params), rollout_correction=corr)
    outputs_keys = {"logprob"}
    batch = {k: v for k, v in b.items() if k not in outputs_keys}

    def ours(lp):
        return objective({"logprob": lp}, batch)[0]

    def expected(lp):
        return call_component(fn, {**inputs, "logprob": lp}, params)[0]

    assert ours(b["logprob"]).item() == pytest.approx(expected(b["logprob"]).item(), rel=1e-9, abs=1e-12)
    assert torch.allclose(autograd_grad(ours, b["logprob"]), autograd_grad(expected, b["logprob"]), atol=1e-12)
    _, metrics = objective({"logprob": b["logprob"]}, batch)
    assert FRACTION[name] in metrics


def test_expert_rows_are_neither_weighted_nor_masked():
    """MIX: an expert row was never sampled (its rollout_logprob means nothing): weight 1, kept."""
    b = loss_batch(2)
    b["is_expert"][[5, 6]] = True
    b["rollout_logprob"][[5, 6]] = 0.0  # a huge "gap" a correction must not see
    spec = ComponentSpec("ROLLOUT_CORRECTION", "token_mis", build_params(ROLLOUT_CORRECTION.get("token_mis"), {}))
    objective = Objective(
        policy_loss=ComponentSpec("POLICY_LOSS_FN", "ppo", build_params(POLICY_LOSS_FN.get("ppo"), {})),
        rollout_correction=spec,
    )
    inputs, metrics = objective._corrected(dict(b))
    assert torch.equal(inputs["advantages"][[5, 6]], b["advantages"][[5, 6]])
    assert torch.equal(inputs["action_mask"][[5, 6]], b["action_mask"][[5, 6]])
    sampled = {k: (v[~b["is_expert"]] if v.dim() else v) for k, v in b.items()}
    _, _, frac = oracle("token_mis", sampled, DEFAULTS["token_mis"])
    assert metrics["rollout_corr/masked_token_frac"] == pytest.approx(frac, abs=1e-12)


def test_ppo_tis_is_ppo_with_token_tis():
    """The kept shorthand: ``ppo_tis`` (cap C) gives ppo + ``token_tis`` (cap C)'s loss and gradient."""
    b = loss_batch(3)
    batch = {k: v for k, v in b.items() if k != "logprob"}
    a = Objective(
        policy_loss=ComponentSpec(
            "POLICY_LOSS_FN", "ppo_tis", build_params(POLICY_LOSS_FN.get("ppo_tis"), {"tis_cap": 1.7})
        )
    )
    c = Objective(
        policy_loss=ComponentSpec("POLICY_LOSS_FN", "ppo", build_params(POLICY_LOSS_FN.get("ppo"), {})),
        rollout_correction=ComponentSpec(
            "ROLLOUT_CORRECTION", "token_tis", build_params(ROLLOUT_CORRECTION.get("token_tis"), {"cap": 1.7})
        ),
    )
    for obj in (a, c):
        assert obj({"logprob": b["logprob"]}, batch)[0].item() == pytest.approx(
            a({"logprob": b["logprob"]}, batch)[0].item(), rel=1e-12
        )
    ga = autograd_grad(lambda lp: a({"logprob": lp}, batch)[0], b["logprob"])
    gc = autograd_grad(lambda lp: c({"logprob": lp}, batch)[0], b["logprob"])
    assert torch.allclose(ga, gc, atol=1e-14)


def test_one_update_corrects_against_the_current_weights():
    """On-policy (one optimiser step per batch) pi_old is the forward's own logprob: rho = pi / mu."""
    b = loss_batch(4)
    batch = {k: v for k, v in b.items() if k not in ("logprob", "old_logprob")}
    spec = ComponentSpec("ROLLOUT_CORRECTION", "icepop", build_params(ROLLOUT_CORRECTION.get("icepop"), {}))
    objective = Objective(
        policy_loss=ComponentSpec("POLICY_LOSS_FN", "ppo", build_params(POLICY_LOSS_FN.get("ppo"), {})),
        rollout_correction=spec,
        one_update=True,
    )
    assert {
        "rollout_logprob",
        "action_mask",
    } <= objective.inputs_needed() and "old_logprob" not in objective.inputs_needed()
    _, metrics = objective({"logprob": b["logprob"]}, batch)
    _, _, frac = oracle("icepop", {**b, "old_logprob": b["logprob"]}, DEFAULTS["icepop"])
    assert metrics["rollout_corr/masked_token_frac"] == pytest.approx(frac, abs=1e-12)


# -- the recipe slot -------------------------------------------------------------------------------------------
RECIPE = """\
name: rc
model:
  path: tiny-random
algorithm:
  type: grpo
  rollout_correction:
    name: seq_tis
    cap: 3.0
buffer:
  tasks:
    generator: arithmetic
trainer:
  engine: local
"""


def plan(tmp_path, *overrides, text=RECIPE):
    from trinity_like.config import load_plan

    path = tmp_path / "rc.yaml"
    path.write_text(text)
    return load_plan(path, [f"run_root={tmp_path}", *overrides])


def test_the_recipe_slot_reaches_the_objective(tmp_path):
    from trinity_like.trainer.objective import objective_from_stage

    (stage,) = plan(tmp_path).stages
    spec = stage.components["rollout_correction"]
    assert (spec.registry, spec.name, spec.params.cap) == ("ROLLOUT_CORRECTION", "seq_tis", 3.0)
    assert {"old_logprob", "rollout_logprob"} <= stage.needs
    objective = objective_from_stage(stage, one_update=False)
    assert objective.rollout_correction == spec and "old_logprob" in objective.inputs_needed()
    (off,) = plan(tmp_path, "algorithm.rollout_correction.name=none").stages
    assert "rollout_correction" not in off.components


@pytest.mark.parametrize(
    "edit, overrides, where, what",
    [
        (("cap: 3.0", "cpa: 3.0"), [], "rc.yaml:8", "unknown parameter of seq_tis; did you mean 'cap'?"),
        (("name: seq_tis", "name: seq_ti"), [], "rc.yaml:7", "unknown rollout correction 'seq_ti'"),
        (("buffer:", "  policy_loss:\n    name: ppo_tis\nbuffer:"), [], "rc.yaml:7", "already corrects"),
        (None, ["algorithm.type=sft", "mode=train"], "rc.yaml:7", "takes no advantages"),
    ],
)
def test_a_wrong_slot_is_one_error_naming_file_line_and_key(tmp_path, edit, overrides, where, what):
    text = RECIPE.replace(*edit) if edit else RECIPE
    with pytest.raises(ConfigError) as info:
        plan(tmp_path, *overrides, text=text)
    msg = str(info.value)
    assert where in msg and "algorithm.rollout_correction" in msg and what in msg and "\n" not in msg, msg
