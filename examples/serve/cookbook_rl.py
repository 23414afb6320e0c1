"""tinker-cookbook's own RL loop trains SmolLM2 through `trinity-like serve`: the official SDK, unchanged.

    python examples/serve/cookbook_rl.py                                    # its own server, SmolLM2, 15 iterations
    python examples/serve/cookbook_rl.py --base-url http://127.0.0.1:8000   # a server you started

The training loop is `tinker_cookbook.rl.train.main` (sampling every group of a batch at
once, centring rewards per group, `importance_sampling` on the sampler's logprobs, a
sampler snapshot per iteration, checkpoints and metrics.jsonl in --log-path), run with
its own `Config` whose `base_url` points at a local `trinity-like serve` process. Only
the problems and the chat format are ours, written with the cookbook's own types:

- `ArithmeticEnv` is a cookbook `ProblemEnv` over one of our arithmetic tasks
  (`trinity_like.explorer.tasks.arithmetic_tasks`: "What is 47 + 8?", a train split and a
  held-out split that never overlap), graded by our `exact_match` reward (1 for the right
  number; ProblemEnv takes 0.1 off a turn that does not end with `<|im_end|>`);
- `ArithmeticDataset` / `ArithmeticDatasetBuilder` are the cookbook's `RLDataset` /
  `RLDatasetBuilder`: batch i is --batch problems, each a `ProblemGroupBuilder` of --group
  episodes;
- `ChatMLRenderer` is a cookbook `Renderer` (registered as "trinity_like/chatml") for
  SmolLM2's ChatML template, since the cookbook ships none for it;
- `GreedyAccuracy` is a cookbook `SamplingClientEvaluator`: the cookbook's `RLTestSetEvaluator`
  rolled out greedily (temperature 0) on held-out problems. The loop runs it at iteration 0
  (and every --eval-every); this script runs it once more on the final checkpoint.

The cookbook's datasets and Llama/Qwen models cannot be downloaded here, so `model_name` is
the local folder of our built-in model (the cookbook's tokenizer helper loads a folder
offline) and the server trains every weight (`lora_rank` 0, as our examples do).
The last line is `held-out greedy accuracy: A% -> B% after N iterations, M min`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path

os.environ.setdefault("TINKER_API_KEY", "tml-local")  # the SDK insists on a "tml-" key; a local server takes any
os.environ.setdefault("TINKER_TELEMETRY", "0")  # the SDK's usage reports: nothing to send them to

import chz
import tinker
from tinker_cookbook import renderers
from tinker_cookbook.completers import TinkerTokenCompleter
from tinker_cookbook.eval.evaluators import SamplingClientEvaluator
from tinker_cookbook.renderers.base import (
    Message,
    ParseTermination,
    RenderContext,
    RenderedMessage,
)
from tinker_cookbook.rl import train
from tinker_cookbook.rl.metric_util import RLTestSetEvaluator
from tinker_cookbook.rl.problem_env import ProblemEnv, ProblemGroupBuilder
from tinker_cookbook.rl.types import EnvGroupBuilder, RLDataset, RLDatasetBuilder
from tinker_cookbook.tokenizer_utils import get_tokenizer

from trinity_like.client.serve.launch import local_server
from trinity_like.errors import TrinityError
from trinity_like.experience import Task
from trinity_like.explorer.rewards import exact_match
from trinity_like.explorer.tasks import ArithmeticParams, arithmetic_tasks
from trinity_like.models.resolve import resolve_model_path

RENDERER = "trinity_like/chatml"
ACCURACY = "test/env/all/correct"  # the share of held-out episodes graded correct (ProblemEnv's "correct")


# -- the chat format, as a cookbook Renderer -------------------------------------------------------
class ChatMLRenderer(renderers.Renderer):
    """``<|im_start|>{role}\\n{content}<|im_end|>`` turns joined by ``\\n`` (SmolLM2's template);
    sampling stops at ``<|im_end|>``, which ends every message's trained output."""

    end = "<|im_end|>"

    @property
    def has_extension_property(self) -> bool:
        return True  # history is rendered as it was sampled: each prompt extends the last

    def _token(self, text: str) -> int:
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"the tokenizer has no single token for {text!r} (got {ids}): not a ChatML model")
        return ids[0]

    def render_message(self, message: Message, ctx: RenderContext) -> RenderedMessage:
        header = ("\n" if ctx.idx > 0 else "") + f"<|im_start|>{message['role']}\n"
        output = renderers.ensure_text(message["content"]) + self.end
        encode = partial(self.tokenizer.encode, add_special_tokens=False)
        return RenderedMessage(
            header=tinker.types.EncodedTextChunk(tokens=encode(header)),
            output=[tinker.types.EncodedTextChunk(tokens=encode(output))],
        )

    def get_stop_sequences(self) -> list[int]:
        return [self._token(self.end)]

    def parse_response(self, response: list[int]) -> tuple[Message, ParseTermination]:
        """The text before ``<|im_end|>``; a clean stop only when that token ends the response."""
        stop = self._token(self.end)
        end = response.index(stop) if stop in response else len(response)
        termination = ParseTermination.STOP_SEQUENCE if end == len(response) - 1 else ParseTermination.MALFORMED
        return Message(role="assistant", content=self.tokenizer.decode(response[:end])), termination


renderers.register_renderer(RENDERER, lambda tokenizer, _image_processor=None: ChatMLRenderer(tokenizer))


# -- our arithmetic tasks, in the cookbook's env and dataset types ---------------------------------
class ArithmeticEnv(ProblemEnv):
    """One of our arithmetic tasks as a cookbook single-turn problem (reward 1 for the right number)."""

    def __init__(self, task: Task, renderer: renderers.Renderer) -> None:
        prefix = [Message(role="system", content=task.system_prompt)] if task.system_prompt else None
        super().__init__(renderer, convo_prefix=prefix)
        self.task = task

    def get_question(self) -> str:
        return self.task.prompt

    def check_answer(self, sample_str: str) -> bool:
        return exact_match(response=sample_str, answer=self.task.answer) == 1.0

    def check_format(self, sample_str: str) -> bool:
        return True  # the format reward is ProblemEnv's: the turn must end with <|im_end|>

    def get_reference_answer(self) -> str:
        return self.task.answer


class ArithmeticDataset(RLDataset):
    """Batch ``i``: ``batch_size`` tasks in order, each a group of ``group_size`` episodes."""

    def __init__(self, tasks: Sequence[Task], renderer: renderers.Renderer, batch_size: int, group_size: int) -> None:
        self.tasks, self.renderer, self.batch_size, self.group_size = list(tasks), renderer, batch_size, group_size

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        tasks = self.tasks[index * self.batch_size : (index + 1) * self.batch_size]
        return [
            ProblemGroupBuilder(
                env_thunk=partial(ArithmeticEnv, task, self.renderer),
                num_envs=self.group_size,
                dataset_name="arithmetic",
            )
            for task in tasks
        ]

    def __len__(self) -> int:
        return len(self.tasks) // self.batch_size


@chz.chz
class ArithmeticDatasetBuilder(RLDatasetBuilder):
    """The train split, ``num_batches`` batches of it (no test set: `GreedyAccuracy` evaluates)."""

    model_path: str  # the model's local folder: its tokenizer
    batch_size: int  # problems (env groups) per iteration
    group_size: int  # episodes per problem
    num_batches: int  # iterations' worth of problems
    seed: int = 0  # which problems, in which order

    async def __call__(self) -> tuple[RLDataset, None]:
        renderer = renderers.get_renderer(RENDERER, get_tokenizer(self.model_path))
        tasks = arithmetic_tasks(ArithmeticParams(), "train", self.num_batches * self.batch_size, seed=self.seed)
        return ArithmeticDataset(tasks, renderer, self.batch_size, self.group_size), None


class GreedyAccuracy(SamplingClientEvaluator):
    """The cookbook's test-set evaluator over held-out problems, sampled greedily."""

    def __init__(self, model_path: str, count: int, max_tokens: int, seed: int) -> None:
        renderer = renderers.get_renderer(RENDERER, get_tokenizer(model_path))
        held_out = arithmetic_tasks(ArithmeticParams(), "eval", count, seed=seed)
        self.test_set = RLTestSetEvaluator(
            ArithmeticDataset(held_out, renderer, batch_size=count, group_size=1),
            max_tokens=max_tokens,
            num_groups_to_log=0,
        )
        self.max_tokens = max_tokens

    async def __call__(self, sampling_client: tinker.SamplingClient) -> dict[str, float]:
        greedy = TinkerTokenCompleter(sampling_client, max_tokens=self.max_tokens, temperature=0.0)
        return await self.test_set.eval_token_completer(greedy)


# -- the run -------------------------------------------------------------------------------------
def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct", help="a built-in id or a local model folder")
    p.add_argument("--base-url", default=None, help="a running `trinity-like serve` (default: start one)")
    p.add_argument("--iterations", type=int, default=15)
    p.add_argument("--batch", type=int, default=8, help="problems (env groups) per iteration")
    p.add_argument("--group", type=int, default=8, help="episodes per problem")
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--lora-rank", type=int, default=0, help="0 trains every weight")
    p.add_argument("--loss", default="importance_sampling", choices=["importance_sampling", "ppo", "cispo"])
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--eval", type=int, default=100, help="held-out problems")
    p.add_argument("--eval-every", type=int, default=5, help="held-out evaluation every N iterations (and at 0)")
    p.add_argument(
        "--save-every",
        type=int,
        default=0,
        help="a resumable checkpoint every N iterations "
        "(0: only the final one; a full SmolLM2 state with Adam's moments is 1.6 GB)",
    )
    p.add_argument("--log-path", default="runs/cookbook_rl")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    for name in ("iterations", "batch", "group", "eval", "eval_every"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def final_sampler_path(log_path: Path) -> str:
    """The sampler weights of the cookbook's last checkpoint (its checkpoints.jsonl)."""
    rows = [json.loads(line) for line in (log_path / "checkpoints.jsonl").read_text().splitlines() if line.strip()]
    with_sampler = [r for r in rows if r.get("sampler_path")]
    if not with_sampler:
        raise SystemExit(f"{log_path / 'checkpoints.jsonl'}: no checkpoint with sampler weights")
    return with_sampler[-1]["sampler_path"]


async def run(args: argparse.Namespace, model_path: str, base_url: str) -> None:
    evaluator = partial(GreedyAccuracy, model_path, args.eval, args.max_tokens, args.seed)
    config = train.Config(
        learning_rate=args.lr,
        model_name=model_path,
        recipe_name="trinity_like_cookbook_rl",
        dataset_builder=ArithmeticDatasetBuilder(
            model_path=model_path,
            batch_size=args.batch,
            group_size=args.group,
            num_batches=args.iterations,
            seed=args.seed,
        ),
        renderer_name=RENDERER,
        max_tokens=args.max_tokens,
        log_path=args.log_path,
        lora_rank=args.lora_rank,
        loss_fn=args.loss,
        eval_every=args.eval_every,
        save_every=args.save_every,
        evaluator_builders=[evaluator],
        base_url=base_url,
        num_groups_to_log=0,
        max_steps=args.iterations,
    )
    started = time.perf_counter()
    await train.main(config)
    minutes = (time.perf_counter() - started) / 60

    # The loop evaluates before training steps only; the final checkpoint is evaluated here.
    service = tinker.ServiceClient(base_url=base_url)
    final = await service.create_sampling_client(
        model_path=final_sampler_path(Path(args.log_path)), base_model=model_path
    )
    after = (await evaluator()(final))[ACCURACY]
    rows = [json.loads(line) for line in (Path(args.log_path) / "metrics.jsonl").read_text().splitlines()]
    before = next(r[ACCURACY] for r in rows if ACCURACY in r)  # iteration 0's evaluation (a resumed run's too)
    service.close("success")
    print(
        f"held-out greedy accuracy: {before:.1%} -> {after:.1%} after {args.iterations} iterations, {minutes:.1f} min"
    )


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        model_path = str(resolve_model_path(args.model).resolve())  # the cookbook's tokenizer helper reads a folder
        if args.base_url is not None:
            asyncio.run(run(args, model_path, args.base_url))
            return
        with local_server(Path(args.log_path) / "serve", "--model", model_path) as url:  # stopped as by Ctrl-C
            print(f"server: {url} (log {Path(args.log_path) / 'serve' / 'server.log'})", flush=True)
            asyncio.run(run(args, model_path, url))
    except TrinityError as err:  # an unknown model, a server that did not start
        raise SystemExit(f"cookbook_rl.py: {err}") from None


if __name__ == "__main__":
    main()
