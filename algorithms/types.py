"""Algorithm types (ALGORITHM_TYPE): declarative bundles of components, default params and flags.

An algorithm type holds no control flow: the trainer reads its slots (which loss, which
advantage, which KL), its params (per-slot defaults a recipe may change) and its flags
(``use_rollout``, ``use_reference``, ``use_critic``, ``schema``, ``dynamic_sampling``).
Offline types (sft, dpo, rm) train on a dataset only: they require ``mode: train``.
A weighted slot's params (``kl_loss``, ``kl_penalty``, ``entropy_loss``) hold its ``coef``:
the weight of the slot's term, which the core applies (the component computes the
unweighted term). A recipe may swap any slot's component (``algorithm.policy_loss.name=...``);
``requires`` pins only what an algorithm cannot work without.
"""

from __future__ import annotations

from trinity_like.components import AlgorithmType
from trinity_like.registry import ALGORITHM_TYPE

OFFLINE = {"mode": "train"}
# A dataset has no explore step whose rows a train step would take: 8 rows (pairs) a step
# unless the recipe says otherwise.
OFFLINE_DEFAULTS = {"buffer.train_batch_size": 8}


def _register(name: str, **fields) -> None:
    ALGORITHM_TYPE.register_module(name, module=AlgorithmType(**fields))


# -- offline ------------------------------------------------------------------------------
_register(
    "sft",
    description="Supervised fine-tuning on a dataset of responses: masked NLL.",
    policy_loss="sft",
    use_rollout=False,
    requires=OFFLINE,
    defaults=OFFLINE_DEFAULTS,
)
_register(
    "dpo",
    description="Direct Preference Optimization on chosen/rejected pairs against a frozen reference (Rafailov et al. 2023).",
    policy_loss="dpo",
    use_rollout=False,
    use_reference=True,
    schema="pair",
    requires=OFFLINE,
    defaults=OFFLINE_DEFAULTS,
)
_register(
    "rm",
    description="Bradley-Terry reward model on pairs: a scalar head read at the last non-pad token (InstructGPT).",
    policy_loss="bradley_terry",
    use_rollout=False,
    schema="pair",
    requires=OFFLINE,
    defaults=OFFLINE_DEFAULTS,
)

# -- online, critic-free (group baselines) ------------------------------------------------
_register(
    "grpo",
    description="GRPO: group-normalised advantages, PPO clip, k3 KL loss to the reference (DeepSeekMath 2024).",
    policy_loss="ppo",
    advantage="grpo",
    kl_loss="k3",
    use_reference=True,
    params={"kl_loss": {"coef": 0.001}},
)
_register(
    "dr_grpo",
    description="Dr.GRPO: GRPO without std normalisation or length bias, no KL (Liu et al. 2025).",
    policy_loss="ppo",
    advantage="grpo",
    params={"policy_loss": {"loss_agg_mode": "seq-mean-token-sum-norm"}, "advantage": {"norm_by_std": False}},
)
_register(
    "dapo",
    description="DAPO: GRPO with clip-higher (0.28), token-mean loss, dynamic sampling of informative groups (Yu et al. 2025).",
    policy_loss="ppo",
    advantage="grpo",
    dynamic_sampling=True,
    # the paper's values, spelled out: they define DAPO whatever PPO's defaults become
    params={"policy_loss": {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "loss_agg_mode": "token-mean"}},
)
_register(
    "rloo",
    description="RLOO: leave-one-out group baseline with the PPO clipped loss (Ahmadian et al. 2024).",
    policy_loss="ppo",
    advantage="rloo",
)
_register(
    "reinforce_plus_plus",
    description="REINFORCE++: per-token k1 KL reward shaping, batch-whitened returns, PPO clip (Hu 2025).",
    policy_loss="ppo",
    advantage="reinforce_plus_plus",
    kl_penalty="k1",
    use_reference=True,
    params={"kl_penalty": {"coef": 0.001}},
)
_register(
    "gspo",
    description="GSPO: group advantages with a clipped sequence-level importance ratio (Zheng et al. 2025).",
    policy_loss="gspo",
    advantage="grpo",
)
_register(
    "cispo",
    description="CISPO: group advantages with a clipped stop-gradient importance weight on log pi (MiniMax-M1 2025).",
    policy_loss="cispo",
    advantage="grpo",
)
_register(
    "mix",
    description="MIX: GRPO on rollouts plus mu-weighted SFT on expert rows mixed into each batch (Trinity-RFT).",
    policy_loss="mix",
    advantage="grpo",
    sample_strategy="mix",
)

# -- online, with a critic -------------------------------------------------------------
_register(
    "ppo",
    description="PPO with a critic: GAE advantages, k1 KL reward shaping, clipped value loss (Ouyang et al. 2022).",
    policy_loss="ppo",
    advantage="gae",
    kl_penalty="k1",
    value_loss="value_clip",
    use_reference=True,
    use_critic=True,
    params={"kl_penalty": {"coef": 0.001}},
)
