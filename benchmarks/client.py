"""What the Tinker-compatible client costs over the engines it drives, interleaved in one run.

Training: one GRPO batch (P prompts x G samples of the built-in arithmetic task, sampled
once by our rollout engine, advantage = reward - group mean) is trained on repeatedly,
one step per repetition, by two contenders that start from the same weights:

- ``engine``: the recipe path -- the batch built by the pipeline's ``experience_batch``
  (prompts left-padded, responses right-padded), the registered ``ppo`` loss (token sum,
  clip 0.2) through an ``Objective``, ``LocalEngine.forward_backward`` + ``optim_step``;
- ``client``: the same samples as Tinker-cookbook datums (``target_tokens`` 0 and zero
  arrays over the prompt), ``TrainingClient.forward_backward(data, "ppo")`` +
  ``optim_step(AdamParams)`` through futures, on its own ``LocalEngine``.

Same model, dtype (fp32), micro-batch size, lr, loss and tokens: the client's extra cost is
its request queue, its Datum checks and layout, and its per-datum outputs and diagnostics.

Sampling: the same prompts, G samples each, same seeds and max tokens, through
``NativeEngine.generate`` (all prompts in one call) and through ``SamplingClient.sample``
(one request per prompt, as Tinker code sends them, futures read after all are sent).

HTTP (``--compare http``): one GRPO iteration of the client loop (examples/client/rl_basic.py's:
P prompts x G samples from the current sampler, reward = exact match, advantage = reward -
group mean, ``forward_backward(data, "importance_sampling")`` + ``optim_step``, a sampler
snapshot of the new weights) run by the same function on two contenders that start from the
same weights and take the same steps with the same seeds:

- ``in-process``: ``trinity_like.client`` in the benchmark's process;
- ``http``: the official ``tinker`` SDK against ``trinity-like serve`` in its own process.

Every group is trained (zero advantages included) so the work does not depend on the
rewards, and each round checks that both sides sampled the same tokens (same weights, same
seeds): the HTTP side's extra time is the protocol -- bodies, futures polled over HTTP, the
SDK's client-side bookkeeping -- not different work.

Rounds alternate which contender goes first; medians and the median of per-round ratios
are reported, with the machine's measured fp32 matmul peak for scale. Run::

    python benchmarks/client.py --model tiny-random --reps 2          # smoke, seconds
    python benchmarks/client.py --model smollm2-135m-instruct --reps 5
    python benchmarks/client.py --compare http --model tiny-random --reps 2
    python benchmarks/client.py --compare http --model smollm2-135m-instruct --reps 5
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from harness import command, git_commit, interleaved, matmul_peak_gflops, md_table, timer, utc_now, write_results  # noqa: E402

import trinity_like.client as tinker  # noqa: E402
from trinity_like.components import ComponentSpec, build_params  # noqa: E402
from trinity_like.experience import Experience  # noqa: E402
from trinity_like.explorer.engine import NativeEngine, SamplingParams  # noqa: E402
from trinity_like.explorer.rewards import exact_match  # noqa: E402
from trinity_like.explorer.tasks import ArithmeticParams, arithmetic_tasks  # noqa: E402
from trinity_like.models.chat import render_prompt  # noqa: E402
from trinity_like.models.resolve import load_model, resolve_model_path  # noqa: E402
from trinity_like.pipeline.batching import experience_batch  # noqa: E402
from trinity_like.plugins import load_plugins  # noqa: E402
from trinity_like.registry import POLICY_LOSS_FN  # noqa: E402
from trinity_like.trainer.local_engine import LocalEngine  # noqa: E402
from trinity_like.trainer.objective import Objective  # noqa: E402
from trinity_like.trainer.params import ModelParams, OptimParams  # noqa: E402

types = tinker.types
OUT = Path(__file__).parent / "results"
ENGINE_CLIENT = ("engine", "client")


def sample_batch(model, tokenizer, args) -> tuple[list[list[int]], list[list], list[str]]:
    """Prompts (token ids), their sampled groups and answers: the batch both trainers train on."""
    tasks = arithmetic_tasks(ArithmeticParams(), "train", args.prompts, seed=args.seed)
    prompts = [render_prompt(tokenizer, t.messages()) for t in tasks]
    groups = NativeEngine(model, tokenizer).generate(
        prompts, SamplingParams(n=args.group, max_new_tokens=args.max_tokens, seed=args.seed)
    )
    return prompts, groups, [t.answer for t in tasks]


def advantages(tokenizer, groups, answers) -> list[list[float]]:
    out = []
    for group, answer in zip(groups, answers, strict=True):
        rewards = [
            exact_match(response=tokenizer.decode(s.token_ids, skip_special_tokens=True), answer=answer) for s in group
        ]
        mean = sum(rewards) / len(rewards)
        out.append([r - mean for r in rewards])
    return out


def engine_batch(prompts, groups, adv, pad_id: int) -> dict[str, torch.Tensor]:
    rows = [
        Experience(
            tokens=list(p) + s.token_ids, prompt_length=len(p), logprobs=s.logprobs, advantages=[a] * len(s.token_ids)
        )
        for p, group, adv_G in zip(prompts, groups, adv, strict=True)
        for s, a in zip(group, adv_G, strict=True)
    ]
    batch = experience_batch(rows, pad_id)
    batch["old_logprob"] = batch["rollout_logprob"]
    return batch


def client_data(prompts, groups, adv) -> list[types.Datum]:
    data = []
    for p, group, adv_G in zip(prompts, groups, adv, strict=True):
        ob = len(p) - 1
        for s, a in zip(group, adv_G, strict=True):
            data.append(
                types.Datum(
                    model_input=types.ModelInput.from_ints(list(p) + s.token_ids[:-1]),
                    loss_fn_inputs={
                        "target_tokens": [0] * ob + s.token_ids,
                        "logprobs": [0.0] * ob + s.logprobs,
                        "advantages": [0.0] * ob + [a] * len(s.token_ids),
                    },
                )
            )
    return data


def alternating(fns: dict, reps: int, what: str, check=None) -> dict[str, list[float]]:
    """Seconds of each of ``fns`` in ``reps`` rounds after a warm-up round (not counted), the order alternating."""

    def after(rep: int, times: dict[str, list[float]]) -> None:
        if check is not None:
            check()
        print(f"{what} round {rep}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()), flush=True)

    times = interleaved(lambda name, _rep: timer(fns[name]), list(fns), reps + 1, after_round=after)
    return {k: v[1:] for k, v in times.items()}


def bench_training(args, folder: Path, batch, data) -> dict:
    ppo = ComponentSpec(
        "POLICY_LOSS_FN",
        "ppo",
        build_params(
            POLICY_LOSS_FN.get("ppo"), {"loss_agg_mode": "token-sum", "clip_ratio_low": 0.2, "clip_ratio_high": 0.2}
        ),
    )
    objective = Objective(policy_loss=ppo)
    model = ModelParams(path=str(folder), micro_batch_size=args.micro_batch)
    engine = LocalEngine(model, OptimParams(lr=args.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, grad_clip=0.0))
    service = tinker.ServiceClient(micro_batch_size=args.micro_batch, log_dir=tempfile.mkdtemp())
    client = service.create_lora_training_client(str(folder), rank=0, seed=args.seed)
    adam = types.AdamParams(learning_rate=args.lr, beta1=0.9, beta2=0.95, eps=1e-8)

    def step_engine():
        engine.forward_backward(batch, objective)
        engine.optim_step()

    def step_client():
        fwd = client.forward_backward(data, "ppo")
        opt = client.optim_step(adam)
        fwd.result(), opt.result()

    times = alternating({"engine": step_engine, "client": step_client}, args.reps, "train")
    service.close()
    tokens = int(batch["response_mask"].sum())
    return summary(times, tokens, "client", "engine")


def bench_sampling(args, model, tokenizer, prompts) -> dict:
    engine = NativeEngine(model, tokenizer)
    sampler = tinker.SamplingClient(args.model)
    inputs = [types.ModelInput.from_ints(p) for p in prompts]
    params = [types.SamplingParams(max_tokens=args.max_tokens, seed=args.seed + i) for i in range(len(prompts))]
    counts = {}

    def run_engine_batched():
        out = engine.run(*batched_requests(prompts, args))
        counts["engine"] = sum(len(s.token_ids) for g in out for s in g)

    def run_client():
        futures = [sampler.sample(x, args.group, p) for x, p in zip(inputs, params, strict=True)]
        counts["client"] = sum(len(s.tokens) for f in futures for s in f.result().sequences)

    def same() -> None:  # the same samples, token for token
        assert counts["engine"] == counts["client"], counts

    times = alternating({"engine": run_engine_batched, "client": run_client}, args.reps, "sample", check=same)
    return summary(times, counts["client"], "client", "engine")


def batched_requests(prompts, args):
    """The engine's own one-call form of the client's requests: prompt i with the seeds
    ``sample(..., seed=seed + i)`` gives it."""
    from trinity_like.explorer.engine import Request, sample_seed

    requests = [
        Request(tuple(p), tuple(sample_seed(args.seed + i, 0, s) for s in range(args.group)))
        for i, p in enumerate(prompts)
    ]
    return requests, SamplingParams(n=args.group, max_new_tokens=args.max_tokens)


def summary(times: dict[str, list[float]], tokens: int, ours: str, base: str) -> dict:
    med = {k: statistics.median(v) for k, v in times.items()}
    rounds = [b / a for a, b in zip(times[ours], times[base], strict=True)]
    return {
        "times": times,
        "median_s": med,
        "tokens": tokens,
        "tokens_per_s": {k: tokens / v for k, v in med.items()},
        "rate_ratio": med[base] / med[ours],
        "median_round_ratio": statistics.median(rounds),
    }


def markdown(result: dict, command: str) -> str:
    t, s, meta = result["training"], result["sampling"], result["meta"]
    train = [f"GRPO train step ({t['tokens']} trained tokens)", *(f"{t['median_s'][k]:.2f} s" for k in ENGINE_CLIENT)]
    sample = [f"sampling ({s['tokens']} tokens)", *(f"{s['tokens_per_s'][k]:.1f} tok/s" for k in ENGINE_CLIENT)]
    rows = [
        [*row, f"**{r['rate_ratio']:.3f}**", f"{r['median_round_ratio']:.3f}"] for row, r in ((train, t), (sample, s))
    ]
    lines = [
        "# Client overhead: TrainingClient / SamplingClient vs the engines they drive",
        "",
        f"Command: `{command}`",
        "",
        f"{meta['model']}, {meta['prompts']} prompts x {meta['group']} samples, up to {meta['max_tokens']} new tokens, "
        f"micro-batch {meta['micro_batch']}, fp32, {meta['reps']} interleaved rounds after one warm-up; "
        f"commit {meta['commit']}, {meta['when']}, load average {meta['load']:.1f}.",
        f"Machine fp32 matmul peak (1024^3, best of 5): {meta['peak_gflops']:.1f} GFLOP/s.",
        "",
        *md_table(
            ["work", "engine", "client", "client rate / engine rate (medians)", "median of per-round ratios"], rows
        ),
        "",
        f"Per-round times (s): training {t['times']}, sampling {s['times']}.",
        f"Model work per train step ~6 x params x tokens = {meta['train_gflop']:.0f} GFLOP: the engine reaches "
        f"{meta['train_gflop'] / t['median_s']['engine'] / meta['peak_gflops']:.0%} of the matmul peak.",
    ]
    return "\n".join(lines)


# -- HTTP (the official SDK against `trinity-like serve`) vs the in-process client ------------------
def grpo_iteration(training, sampler, renderer, tasks, args, step: int):
    """One iteration of the client loop, written once for both doors: sample, score, train, snapshot.

    Returns the new sampler and the iteration's phases (s) and sampled tokens."""
    started = time.perf_counter()
    params = types.SamplingParams(max_tokens=args.max_tokens, stop=renderer.get_stop_sequences(), temperature=1.0)
    prompts = [renderer.build_generation_prompt(t.messages()) for t in tasks]
    futures = [
        sampler.sample(p, args.group, params.model_copy(update={"seed": step * 1000 + i}))
        for i, p in enumerate(prompts)
    ]
    groups = [f.result().sequences for f in futures]
    sampled = time.perf_counter()
    data = []
    for task, prompt, group in zip(tasks, prompts, groups, strict=True):
        rewards = [
            exact_match(response=renderer.parse_response(s.tokens)[0]["content"], answer=task.answer) for s in group
        ]
        mean = sum(rewards) / len(rewards)
        ob = prompt.length - 1  # every group is trained, equal rewards too: the work does not depend on them
        for seq, r in zip(group, rewards, strict=True):
            data.append(
                types.Datum(
                    model_input=prompt.append(types.EncodedTextChunk(tokens=seq.tokens[:-1])),
                    loss_fn_inputs={
                        "target_tokens": [0] * ob + seq.tokens,
                        "logprobs": [0.0] * ob + seq.logprobs,
                        "advantages": [0.0] * ob + [r - mean] * len(seq.tokens),
                    },
                )
            )
    fwd = training.forward_backward(data, "importance_sampling")
    opt = training.optim_step(types.AdamParams(learning_rate=args.lr, beta1=0.9, beta2=0.95, eps=1e-8))
    fwd.result(), opt.result()
    trained = time.perf_counter()
    sampler = training.save_weights_and_get_sampling_client().result()  # in-process: the client answers result()
    done = time.perf_counter()
    phases = {
        "iteration": done - started,
        "sample": sampled - started,
        "train": trained - sampled,
        "snapshot": done - trained,
    }
    return sampler, phases, [s.tokens for g in groups for s in g]


def compare_http(args, folder: Path, peak: float, command: str) -> None:
    import tinker as sdk

    from trinity_like.client.renderers import get_renderer
    from trinity_like.client.serve.launch import local_server

    os.environ.setdefault("TINKER_API_KEY", "tml-local")  # the SDK insists on a "tml-" key; a local server takes any
    os.environ.setdefault("TINKER_TELEMETRY", "0")
    tasks = arithmetic_tasks(ArithmeticParams(), "train", (args.reps + 1) * args.prompts, seed=args.seed)
    scratch = Path(tempfile.mkdtemp(prefix="bench-client-http-"))
    local = tinker.ServiceClient(micro_batch_size=args.micro_batch, log_dir=scratch / "local")
    with local_server(scratch / "serve", "--model", str(folder), "--micro-batch-size", str(args.micro_batch)) as url:
        remote = sdk.ServiceClient(base_url=url)
        trainers = {
            "in-process": local.create_lora_training_client(str(folder), rank=0, seed=args.seed),
            "http": remote.create_lora_training_client(str(folder), rank=0, seed=args.seed).result(),
        }
        renderer = get_renderer("chatml", trainers["in-process"].get_tokenizer())
        samplers = {k: t.save_weights_and_get_sampling_client().result() for k, t in trainers.items()}
        tokens: dict[str, list] = {}

        def run(name: str, rep: int) -> dict[str, float]:  # the first round warms up and is not counted
            batch = tasks[rep * args.prompts : (rep + 1) * args.prompts]
            sampler, took, tokens[name] = grpo_iteration(trainers[name], samplers[name], renderer, batch, args, rep)
            samplers[name] = sampler
            return took

        def after(rep: int, phases: dict[str, list[dict]]) -> None:
            same_samples.append(tokens["in-process"] == tokens["http"])
            times = ", ".join(f"{k} {v[-1]['iteration']:.2f} s" for k, v in phases.items())
            print(f"round {rep}: {times}{'' if same_samples[-1] else ' (samples differ)'}", flush=True)

        same_samples: list[bool] = []  # the warm-up round's too
        phases = {k: v[1:] for k, v in interleaved(run, list(trainers), args.reps + 1, after_round=after).items()}
        remote.close("success").result()
    local.close()
    shutil.rmtree(scratch)  # the server's data directory and the in-process client's logs
    times = {k: [p["iteration"] for p in v] for k, v in phases.items()}
    result = {
        "meta": context(args, peak),
        "phases": phases,
        "same_samples": same_samples,
        "median_s": {k: statistics.median(v) for k, v in times.items()},
        "phase_medians_s": {k: {ph: statistics.median(p[ph] for p in v) for ph in v[0]} for k, v in phases.items()},
        "median_ratio": statistics.median(times["http"]) / statistics.median(times["in-process"]),
        "median_round_ratio": statistics.median(h / i for h, i in zip(times["http"], times["in-process"])),
    }
    name = args.out or ("client_http_tiny" if args.model == "tiny-random" else "client_http")
    print(write_results(OUT / name, result, markdown_http(result, command)))


def markdown_http(result: dict, command: str) -> str:
    meta, ph = result["meta"], result["phase_medians_s"]
    added = result["median_ratio"] - 1
    rows = [[p, f"{ph['in-process'][p]:.3f}", f"{ph['http'][p]:.3f}", f"{ph['http'][p] / ph['in-process'][p]:.3f}"]
            for p in ("iteration", "sample", "train", "snapshot")]  # fmt: skip
    verdict = "met" if added <= 0.15 else "NOT met"
    lines = [
        "# One GRPO iteration of the client loop: the official SDK over HTTP vs the in-process client",
        "",
        f"Command: `{command}`",
        "",
        f"{meta['model']}, {meta['prompts']} prompts x {meta['group']} samples, up to {meta['max_tokens']} new tokens, "
        f"`importance_sampling`, full fine-tune, micro-batch {meta['micro_batch']}, fp32; the server in its own "
        f"process; {meta['reps']} interleaved rounds after one warm-up; commit {meta['commit']}, {meta['when']}, "
        f"load average {meta['load']:.1f}. Machine fp32 matmul peak: {meta['peak_gflops']:.1f} GFLOP/s.",
        f"Both sides sampled the same tokens in {sum(result['same_samples'])} of {len(result['same_samples'])} "
        "rounds (same weights, same seeds: the same work).",
        "",
        *md_table(["phase (median s)", "in-process", "http", "http / in-process"], rows),
        "",
        f"HTTP adds **{added:+.1%}** to an iteration (ratio of medians {result['median_ratio']:.3f}; median of "
        f"per-round ratios {result['median_round_ratio']:.3f}); target at most +15 %: {verdict}.",
        f"Per-round iteration times (s): in-process {[round(p['iteration'], 3) for p in result['phases']['in-process']]},"
        f" http {[round(p['iteration'], 3) for p in result['phases']['http']]}.",
    ]
    return "\n".join(lines)


def context(args: argparse.Namespace, peak: float) -> dict:
    """The run's settings and where it ran (the ``meta`` of both comparisons)."""
    versions = {"python": platform.python_version(), "torch": torch.__version__}
    return {
        **vars(args),
        "peak_gflops": peak,
        "commit": git_commit(),
        "load": os.getloadavg()[0],
        "when": utc_now(),
        **versions,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--compare",
        default="engine",
        choices=["engine", "http"],
        help="engine: the client vs the engines it drives; http: the SDK over HTTP vs the in-process client",
    )
    p.add_argument("--out", default=None, help="results name (default: client[_http], with _tiny for tiny-random)")
    args = p.parse_args(argv)
    load_plugins()
    folder = resolve_model_path(args.model)
    peak = matmul_peak_gflops()
    if args.compare == "http":
        compare_http(args, folder, peak, command("client.py", argv))
        return
    model, tokenizer = load_model(folder)
    prompts, groups, answers = sample_batch(model, tokenizer, args)
    adv = advantages(tokenizer, groups, answers)
    batch = engine_batch(prompts, groups, adv, tokenizer.pad_token_id)
    data = client_data(prompts, groups, adv)
    sampling = bench_sampling(args, model, tokenizer, prompts)
    del model
    training = bench_training(args, folder, batch, data)
    params = sum(t.numel() for t in load_model(folder)[0].parameters())
    meta = {**context(args, peak), "train_gflop": 6 * params * training["tokens"] / 1e9}
    result = {"meta": meta, "training": training, "sampling": sampling}
    name = args.out or ("client_tiny" if args.model == "tiny-random" else "client")
    print(write_results(OUT / name, result, markdown(result, command("client.py", argv))))


if __name__ == "__main__":
    main()
