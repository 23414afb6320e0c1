"""Sample strategies against a list-backed buffer double implementing trinity_like.buffer.base's protocols."""

from __future__ import annotations

import pytest
from _lib.algo_testlib import ListExpert, ListSource, experience

from trinity_like.buffer.base import ExperienceSource, ExpertSource
from trinity_like.components import build_params
from trinity_like.errors import ConfigError
from trinity_like.registry import SAMPLE_STRATEGY


def strategy(name, **params):
    cls = SAMPLE_STRATEGY.get(name)
    return cls(params=build_params(cls, params))


def source(versions):
    return ListSource([experience(version=v) for v in versions])


def test_the_doubles_satisfy_the_protocols():
    assert isinstance(ListSource(), ExperienceSource) and isinstance(ListExpert([]), ExpertSource)


def test_default_claims_in_write_order_or_freshest_first():
    src = source([0, 2, 1, 2, 0])
    first = strategy("default").sample(experiences=src, batch_size=3, model_version=3)
    assert [e.eid for e in first] == [r.eid for r in src.rows[:3]]
    assert src.count("claimed") == 3 and src.count("available") == 2
    src = source([0, 2, 1, 2, 0])
    fresh = strategy("default", order="newest_version").sample(experiences=src, batch_size=3, model_version=3)
    assert [e.model_version for e in fresh] == [2, 2, 1]


def test_mix_adds_expert_rows_on_top_of_every_rollout_row():
    src = source([0] * 12)
    expert = ListExpert([experience(reward=None, group="expert") for _ in range(3)])
    s = strategy("mix", expert_ratio=0.25)
    batch = s.sample(experiences=src, batch_size=6, model_version=0, expert=expert)
    # all 6 rollout rows, then 2 expert rows: 2 / 8 = 0.25 of the batch
    assert [e.is_expert for e in batch] == [False] * 6 + [True] * 2
    assert [e.eid for e in batch[:6]] == [r.eid for r in src.rows[:6]]
    assert src.count("claimed") == 6 and src.count("available") == 6
    batch = s.sample(experiences=src, batch_size=6, model_version=0, expert=expert)  # expert rows cycle
    assert [e.eid for e in batch[:6]] == [r.eid for r in src.rows[6:]] and sum(e.is_expert for e in batch) == 2
    assert src.count("available") == 0  # nothing the explorer wrote is left behind
    state = s.state_dict()
    assert state == {"expert_rows": 4}
    restored = strategy("mix", expert_ratio=0.25)
    restored.load_state_dict(state)
    assert restored.state_dict() == state


@pytest.mark.parametrize("rollouts, ratio", [(64, 0.25), (64, 0.1), (6, 0.5), (32, 0.75), (5, 0.2)])
def test_mix_expert_share_of_the_final_batch_is_the_ratio(rollouts, ratio):
    src = source([0] * rollouts)
    expert = ListExpert([experience(reward=None, group="expert")])
    batch = strategy("mix", expert_ratio=ratio).sample(
        experiences=src, batch_size=rollouts, model_version=0, expert=expert
    )
    n_expert = sum(e.is_expert for e in batch)
    assert len(batch) - n_expert == rollouts  # every rollout row
    assert abs(n_expert - ratio * len(batch)) <= 0.5  # r of the final batch, to the nearest row


def test_mix_after_a_short_claim_keeps_the_ratio():
    src = source([0] * 3)  # the explorer wrote only 3 rows before the timeout
    expert = ListExpert([experience(reward=None, group="expert")])
    batch = strategy("mix", expert_ratio=0.5, timeout=0.0).sample(
        experiences=src, batch_size=8, model_version=0, expert=expert
    )
    assert [e.is_expert for e in batch] == [False] * 3 + [True] * 3


def test_only_mix_declares_that_it_uses_expert_data():
    first_party = ("default", "mix", "staleness")  # other tests register strategies of their own
    assert {name: SAMPLE_STRATEGY.get(name).uses_expert_data for name in first_party} == {
        "default": False,
        "mix": True,
        "staleness": False,
    }


def test_mix_without_an_expert_dataset_is_an_error():
    with pytest.raises(ValueError, match="expert"):
        strategy("mix").sample(experiences=source([0] * 4), batch_size=4, model_version=0)
    batch = strategy("mix", expert_ratio=0.0).sample(experiences=source([0] * 4), batch_size=4, model_version=0)
    assert len(batch) == 4 and not any(e.is_expert for e in batch)


def test_staleness_drops_rows_older_than_max_staleness():
    src = source([0, 5, 3, 4, 2, 5])
    s = strategy("staleness", max_staleness=1)
    batch = s.sample(experiences=src, batch_size=4, model_version=5)
    assert sorted(e.model_version for e in batch) == [4, 5, 5]  # staleness 0, 0, 1
    assert src.count("dropped") == 3 and s.state_dict()["dropped"] == 3


def test_staleness_zero_is_on_policy_only():
    src = source([3, 4, 4])
    batch = strategy("staleness", max_staleness=0).sample(experiences=src, batch_size=3, model_version=4)
    assert [e.model_version for e in batch] == [4, 4]


def test_staleness_downweight_scales_the_action_mask_of_stale_rows():
    src = source([5, 4, 3, 1])
    s = strategy("staleness", max_staleness=1, mode="downweight", decay=0.5)
    batch = s.sample(experiences=src, batch_size=4, model_version=5)
    # staleness 0, 1, 2, 4 -> weights 1, 1, 0.5, 0.125 on every response token
    assert [e.mask() for e in batch] == [[1] * 3, [1] * 3, [0.5] * 3, [0.125] * 3]
    assert [e.eid for e in batch] == [r.eid for r in src.rows]  # same rows: claims commit by id
    assert src.count("dropped") == 0 and s.state_dict() == {"dropped": 0, "downweighted": 2}


def test_params_are_validated():
    with pytest.raises(ConfigError):
        build_params(SAMPLE_STRATEGY.get("mix"), {"expert_ratio": 1.5})
    with pytest.raises(ConfigError, match="on top of the rollouts"):  # 1.0 would need infinitely many
        build_params(SAMPLE_STRATEGY.get("mix"), {"expert_ratio": 1.0})
    with pytest.raises(ConfigError):
        build_params(SAMPLE_STRATEGY.get("staleness"), {"mode": "discard"})
    with pytest.raises(ConfigError, match="max_staleness"):
        build_params(SAMPLE_STRATEGY.get("staleness"), {"max_stalenes": 2})
