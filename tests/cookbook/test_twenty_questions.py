"""Twenty Questions: the game's rules, its token history, the answerer model and its words."""

from __future__ import annotations

import pytest

from cookbook.envs.twenty_questions import (
    HELD_OUT_WORDS,
    PLAYER_SYSTEM_PROMPT,
    TRAIN_WORDS,
    TwentyQuestionsTaskParams,
    example_conversation,
    opening,
    twenty_questions_tasks,
)
from trinity_like.envs.dataset import build_env_factory
from trinity_like.envs.rollout import RolloutParams, rollout_groups
from trinity_like.errors import TrinityError
from trinity_like.experience import Task
from trinity_like.models.chat import render_prompt

CANDIDATES = ["cat", "bread", "lamp", "cup"]
TASK = Task(
    "I am thinking of one of these words: cat, bread, lamp, cup.", "lamp", "g0", info={"candidates": CANDIDATES}
)
ANSWERER = {"answerer_model": "tiny-random", "answerer_max_tokens": 4}


def factory_of(tok, **params):
    return build_env_factory("twenty_questions", {**ANSWERER, **params}, tokenizer=tok)


def play(tok, env, text):
    return env.step(tok.encode(text, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")])


def test_the_prompt_shows_the_rules_an_example_game_and_the_list(tok):
    env = factory_of(tok, max_turns=3).group_builder(TASK, 1).make_envs()[0]
    prompt, stop = env.initial_observation()
    messages = [
        {"role": "system", "content": PLAYER_SYSTEM_PROMPT},
        *example_conversation(3),
        {"role": "user", "content": opening(CANDIDATES, 3)},
    ]
    assert prompt == render_prompt(tok, messages)
    assert "cat, bread, lamp, cup. You have 3 turns." in tok.decode(prompt) and stop.max_tokens == 24


def test_a_game_wrong_guess_question_right_guess(tok):
    factory = factory_of(tok, max_turns=4, turn_penalty=0.1)
    env = factory.group_builder(TASK, 1).make_envs()[0]
    history, _ = env.initial_observation()
    calls = factory.answerer().calls

    first = play(tok, env, "Is it a cat?")  # a listed word: a guess, judged by rule
    assert (first.reward, first.episode_done) == (0.0, False)
    assert first.metrics == {"guesses": 1.0, "questions": 0.0, "repeats": 0.0}
    assert tok.decode(first.next_observation).endswith("No, it is not cat.<|im_end|>\n<|im_start|>assistant\n")
    assert first.next_observation[: len(history)] == history  # token in, token out: only appended to

    second = play(tok, env, "Can you eat it?")  # no listed word: the answerer model answers
    assert second.metrics == {"guesses": 0.0, "questions": 1.0, "repeats": 0.0}
    assert second.next_observation[: len(first.next_observation)] == first.next_observation
    assert factory.answerer().calls in (calls, calls + 1)  # + 1 unless an earlier test asked the same

    third = play(tok, env, "Is it cats?")  # ruled out already
    assert third.metrics["repeats"] == 1.0 and not third.episode_done

    last = play(tok, env, "Is it a LAMP?")
    assert last.episode_done and last.reward == pytest.approx(1.0 - 0.1 * 3)
    assert last.metrics == {"guesses": 1.0, "questions": 0.0, "repeats": 0.0, "solved": 1.0}


def test_a_game_ends_unsolved_after_max_turns(tok):
    env = factory_of(tok, max_turns=2).group_builder(TASK, 1).make_envs()[0]
    env.initial_observation()
    assert not play(tok, env, "Is it a cup?").episode_done
    last = play(tok, env, "Is it a cat or a cup?")  # two words: a question, and the last turn
    assert (last.reward, last.episode_done, last.metrics["solved"]) == (0.0, True, 0.0)


def test_a_repeated_guess_costs_repeat_penalty_at_any_turn(tok):
    env = factory_of(tok, max_turns=3, repeat_penalty=0.25).group_builder(TASK, 1).make_envs()[0]
    env.initial_observation()
    assert play(tok, env, "Is it a cup?").reward == 0.0  # a first wrong guess costs nothing
    second = play(tok, env, "Is it a cup?")
    assert (second.reward, second.episode_done, second.metrics["repeats"]) == (-0.25, False, 1.0)
    last = play(tok, env, "Cups?")  # the last turn: the game ends, and the repeat still costs
    assert (last.reward, last.episode_done, last.metrics["solved"]) == (-0.25, True, 0.0)
    default = factory_of(tok, max_turns=3).group_builder(TASK, 1).make_envs()[0]
    default.initial_observation()
    play(tok, default, "Is it a cup?")
    assert play(tok, default, "Is it a cup?").reward == 0.0  # off by default


def test_the_answerer_model_answers_once_per_word_and_question(tok):
    answerer = factory_of(tok).answerer()
    before = answerer.calls
    reply = answerer.answer("lamp", "Does it give light?")
    assert isinstance(reply, str) and reply and answerer.answer("lamp", " Does it give light? ") == reply
    assert answerer.calls == before + 1
    answerer.answer("cup", "Does it give light?")  # another word: another answer
    assert answerer.calls == before + 2
    assert factory_of(tok).answerer() is answerer  # one model per process, however many factories


def test_held_out_games_never_show_a_training_word():
    assert not set(TRAIN_WORDS) & set(HELD_OUT_WORDS)
    for split, pool in (("train", TRAIN_WORDS), ("eval", HELD_OUT_WORDS)):
        tasks = twenty_questions_tasks(split, 2 * len(pool), seed=3, params=TwentyQuestionsTaskParams(candidates=5))
        assert all(t.answer in t.info["candidates"] and set(t.info["candidates"]) <= set(pool) for t in tasks)
        assert all(len(set(t.info["candidates"])) == 5 for t in tasks)
        # each word is the secret once per pass over the pool
        assert sorted(t.answer for t in tasks[: len(pool)]) == sorted(pool)
    again = twenty_questions_tasks("train", 8, seed=3)
    assert [t.info for t in again] == [t.info for t in twenty_questions_tasks("train", 8, seed=3)]
    assert [t.info for t in again] != [t.info for t in twenty_questions_tasks("train", 8, seed=4)]


def test_bad_params_and_tasks_are_one_line_errors(tok):
    with pytest.raises(TrinityError, match="turn_penalty"):
        factory_of(tok, max_turns=5, turn_penalty=0.25)
    with pytest.raises(TrinityError, match="repeat_penalty must be >= 0"):
        factory_of(tok, repeat_penalty=-0.1)
    with pytest.raises(TrinityError, match="candidates must be in 2..16"):
        TwentyQuestionsTaskParams(candidates=17)
    with pytest.raises(TrinityError, match="needs info.candidates holding its answer 'lamp'"):
        factory_of(tok).group_builder(Task("?", "lamp", "x"), 2)


def test_games_run_on_the_rollout_engine(tok, engine):
    factory = factory_of(tok, max_turns=3, max_tokens=8)
    builders = [factory.group_builder(t, 3) for t in twenty_questions_tasks("train", 2, seed=0)]
    result = rollout_groups(builders, engine=engine, seed=0, params=RolloutParams(max_turns=8))
    assert not result.dropped and result.metrics["rollout/episodes"] == 6
    assert 1 <= result.metrics["rollout/turns/mean"] <= 3
    for key in ("env/solved", "env/guesses", "env/questions", "env/repeats"):
        assert key in result.metrics
    for group in result.groups:
        for traj in group.trajectories:
            for before, after in zip(traj.transitions, traj.transitions[1:]):  # every turn extends the last
                assert after.observation[: len(before.observation) + len(before.action)] == (
                    before.observation + before.action
                )


def test_questions_asked_together_are_answered_in_one_engine_call(tok):
    """The games of a turn step at once (concurrent_steps): their questions make one batch."""
    from concurrent.futures import ThreadPoolExecutor

    answerer = factory_of(tok).answerer()
    questions = [f"Is it bigger than a {n}-year-old shoe?" for n in range(12)]
    batches, calls = answerer.batches, answerer.calls
    with ThreadPoolExecutor(len(questions)) as pool:
        together = list(pool.map(lambda q: answerer.answer("lamp", q), questions))
    assert answerer.calls == calls + 12 and answerer.batches <= batches + 2  # one batch, two if a thread was late
    alone = [answerer.engine.generate([answerer.prompt("lamp", q)], greedy(answerer))[0][0] for q in questions]
    assert together == [
        answerer.reply(answerer.tokenizer.decode(s.token_ids, skip_special_tokens=True)) for s in alone
    ]  # batched greedy answers equal one-by-one ones


def greedy(answerer):
    from trinity_like.explorer.engine import SamplingParams

    return SamplingParams(greedy=True, max_new_tokens=answerer.max_tokens)


def test_a_failing_answerer_fails_every_asker_of_its_batch(tok, monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    answerer = factory_of(tok).answerer()

    def broken(*args, **kwargs):
        raise RuntimeError("engine down")

    monkeypatch.setattr(answerer.engine, "run", broken)  # generate() is a helper over the engine's run
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(answerer.answer, "cup", f"Is it number {n}?") for n in range(4)]
    assert all(isinstance(f.exception(), RuntimeError) for f in futures)
    assert not answerer._pending and not answerer._busy  # nothing left waiting: the next turn can ask again
