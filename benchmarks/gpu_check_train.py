"""The training sections of ``benchmarks/gpu_check.py``: the train step against plain torch, and
a short ``trinity-like run`` of the main recipe (see that module for what and why)."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from gpu_check_parts import ROOT, Check, free, load_packs, plugin_env, timed
from gpu_check_run import Entry

from trinity_like.models.device import train_dtypes
from trinity_like.models.shapes import shaped_folder

RECIPE = ROOT / "examples" / "grpo_arith.yaml"
NO_RAY = "import sys; sys.modules['ray'] = None; from trinity_like.cli import main; sys.exit(main(sys.argv[1:]))"


# -- training --------------------------------------------------------------------------------
def folder_of(check: Check, shape: str) -> Path:
    """A random model of ``shape`` as a folder, written once per check (whole or not at all: a
    process killed while writing it leaves only a scratch folder the next one ignores)."""
    path = check.work / f"shape-{shape}"
    if not (path / "config.json").is_file():
        scratch = check.work / f".shape-{shape}-{os.getpid()}"
        shutil.rmtree(scratch, ignore_errors=True)
        os.replace(shaped_folder(shape, scratch), path)
    return path


def grpo_objective(folder: Path):
    """The loss a GRPO recipe trains with (examples/grpo_arith.yaml resolved against the registries)."""
    from trinity_like.config import load_plan
    from trinity_like.trainer.objective import objective_from_stage

    load_packs()
    plan = load_plan(RECIPE, [f"model.path={folder}", "trainer.engine=local"])
    return objective_from_stage(plan.stages[0], one_update=True)


def grpo_batch(vocab: int, rows: int, group: int, prompt_len: int, response_len: int) -> dict[str, torch.Tensor]:
    """``rows`` full-length rows in the engine layout, ``group`` per shared prompt. Advantages are drawn
    at random, not group-centred: at ratio 1 a centred batch's loss is 0, and the two sides' first
    losses would then agree whatever they computed."""
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, vocab, (rows // group, prompt_len), generator=g).repeat_interleave(group, dim=0)
    responses = torch.randint(3, vocab, (rows, response_len), generator=g)
    adv = torch.randn(rows, generator=g)
    ids = torch.cat([prompts, responses], dim=1)
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "position_ids": torch.arange(ids.shape[1]).expand(rows, -1).contiguous(),
        "response_mask": torch.ones(rows, response_len),
        "advantages": adv[:, None].expand(-1, response_len).contiguous(),
    }


def plain_step(model, optimizer, batch, objective, micro_batch: int, compute: torch.dtype | None) -> float:
    """The same update in plain torch: padded forward, full logits, log_softmax, the objective, AdamW."""
    from trinity_like.trainer.base import micro_batches, with_normalisers

    device = next(model.parameters()).device
    response_len = batch["response_mask"].shape[1]
    total = 0.0
    for mb in micro_batches(with_normalisers(batch), micro_batch):
        mb = {k: v.to(device) for k, v in mb.items()}
        with torch.autocast(device.type, dtype=compute, enabled=compute is not None):
            logits = model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"]).logits
        logp = logits[:, -response_len - 1 : -1].float().log_softmax(-1)
        logprob = logp.gather(-1, mb["input_ids"][:, -response_len:, None]).squeeze(-1)
        loss, _ = objective({"logprob": logprob}, mb)
        loss.backward()
        total += float(loss.detach())
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total


def train_step_entries(check: Check) -> list[Entry]:
    shape = "tiny" if check.tiny else "smollm2-135m"
    rows, group, prompt_len, response_len = (8, 4, 16, 32) if check.tiny else (64, 8, 64, 256)

    def run() -> dict:
        out = train_step(check, shape, rows, group, prompt_len, response_len, micro_batch=8)
        free(check.device)
        return out

    return [Entry(shape, check.limit(25), run)]


def train_step(
    check: Check, shape: str, rows: int, group: int, prompt_len: int, response_len: int, micro_batch: int
) -> dict:
    from transformers import AutoModelForCausalLM

    from trinity_like.trainer.local_engine import LocalEngine
    from trinity_like.trainer.params import ModelParams, OptimParams

    device, reps = check.device, (1 if check.tiny else 2)
    folder = folder_of(check, shape)
    objective = grpo_objective(folder)
    engine = LocalEngine(ModelParams(path=str(folder), micro_batch_size=micro_batch, device=str(device)), OptimParams())
    weights, compute = train_dtypes("auto", device)
    plain = AutoModelForCausalLM.from_pretrained(folder, dtype=weights).to(device).train()
    o = OptimParams()
    optimizer = torch.optim.AdamW(plain.parameters(), lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay)
    batch = grpo_batch(plain.config.vocab_size, rows, group, prompt_len, response_len)

    def ours() -> float:
        loss = engine.forward_backward(batch, objective)["loss"]
        engine.optim_step()
        return loss

    steps = {"ours": ours, "plain_torch": lambda: plain_step(plain, optimizer, batch, objective, micro_batch, compute)}
    times: dict[str, list[float]] = {k: [] for k in steps}
    losses = {k: timed(device, fn)[1] for k, fn in steps.items()}  # warm-up; the first losses: the same update
    for rep in range(reps):
        for name in list(steps)[rep % 2 :] + list(steps)[: rep % 2]:  # alternate who goes first
            times[name].append(timed(device, steps[name])[0])
    tokens = rows * (prompt_len + response_len)
    out = {
        "shape": shape,
        "rows": rows,
        "tokens_per_row": prompt_len + response_len,
        "micro_batch": micro_batch,
        "precision": f"weights {weights}, autocast {compute}".replace("torch.", ""),
        "first_loss": losses,
    }
    for name, ts in times.items():
        out[name] = {"step_s": statistics.median(ts), "tokens_per_s": tokens / statistics.median(ts)}
    out["ours_over_plain"] = out["plain_torch"]["step_s"] / out["ours"]["step_s"]
    engine.close()
    return out


def grpo_run_entries(check: Check) -> list[Entry]:
    shape = "tiny" if check.tiny else "smollm2-135m"
    limit = check.limit(30)
    return [Entry(shape, limit, lambda: grpo_run(check, shape, timeout=limit - 3))]


def grpo_run(check: Check, shape: str, timeout: float) -> dict:
    """``trinity-like run`` of the main job's recipe on random weights of ``shape``, with Ray unimportable."""
    folder = folder_of(check, shape)
    run_root = check.work / "runs"
    overrides = [
        f"run_root={run_root}",
        "name=gpu_check",
        f"model.path={folder}",
        f"cluster.device={check.device}",
        "trainer.engine=local",
        "explorer.placement=driver",
        "monitor.backends=[jsonl]",
        "monitor.progress=false",
        "checkpoint.resume=false",
        # Random weights never answer right: every group would score the same and be dropped
        # unseen; the step is timed with every row trained (rewards: "contains a digit").
        "algorithm.dynamic_sampling=false",
        "explorer.reward_fn=format",
        "explorer.reward_args={pattern: '.*[0-9].*'}",
        "explorer.eval_reward_fn=exact_match",
    ]
    if check.tiny:
        overrides += ["trainer.total_steps=2", "buffer.eval_tasks.size=2", "explorer.batch_size=2"]
    else:
        overrides += ["trainer.total_steps=10"]  # the plan's 30 s: start-up, 10 steps, the evaluations
    cmd = [sys.executable, "-c", NO_RAY, "run", "--config", str(RECIPE), *overrides]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=plugin_env(), capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    out: dict[str, Any] = {"command": "trinity-like run --config examples/grpo_arith.yaml " + " ".join(overrides[1:])}
    out.update(returncode=proc.returncode, wall_s=wall, ray_importable=False)
    if proc.returncode != 0:
        return {**out, "status": "failed", "stderr": proc.stderr[-3000:]}
    rows = [json.loads(line) for line in (run_root / "gpu_check" / "metrics.jsonl").read_text().splitlines() if line]
    steps = [r for r in rows if "time/step" in r]
    out["steps"] = len(steps)
    for key in ("time/step", "time/rollout", "time/train", "throughput/tokens_per_s"):
        values = [r[key] for r in steps if key in r]
        if values:
            out[key] = statistics.median(values)
    evals = [r for r in rows if "eval/accuracy" in r]
    out["eval_points"] = len(evals)
    return out
