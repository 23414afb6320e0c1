"""The sections of ``benchmarks/gpu_check.py`` and its report (see that module for what and why)."""

from __future__ import annotations

import gc
import importlib.metadata
import json
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trinity_like.explorer.engine import NativeEngine, SamplingParams
from trinity_like.models.device import precision, train_dtypes
from trinity_like.models.shapes import shaped_folder, shaped_model
from trinity_like.models.tiny import build_tiny_tokenizer
from trinity_like.plugins import ENV_VAR, entry_points, load_plugins

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "examples" / "grpo_arith.yaml"
EXAMPLE_PLUGIN = ROOT / "plugins" / "example_plugin" / "src" / "example_plugin"
PACKS = "algorithms" + ":" + "cookbook"  # the first-party packs, by module name where they are not installed
NO_RAY = "import sys; sys.modules['ray'] = None; from trinity_like.cli import main; sys.exit(main(sys.argv[1:]))"


# -- plumbing --------------------------------------------------------------------------------
def plugin_env() -> dict[str, str]:
    """This process's environment for a child, plus the first-party packs by module name when they
    are not installed (a GPU machine runs the checkout from its folder: no entry points there)."""
    import os

    env = dict(os.environ)
    if not entry_points():
        env[ENV_VAR] = PACKS if not env.get(ENV_VAR) else f"{PACKS}{os.pathsep}{env[ENV_VAR]}"
    env.setdefault("RAY_AUTH_MODE", "disabled")
    return env


def load_packs() -> None:
    """The first-party packs in this process: through their entry points, or by module name."""
    load_plugins([] if entry_points() else PACKS.split(":"))


def junit_counts(report: Path) -> dict[str, int]:
    """Passed / failed / skipped / errors of a pytest ``--junitxml`` report."""
    if not report.is_file():
        return {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    tests, failures = int(suite.get("tests", 0)), int(suite.get("failures", 0))
    errors, skipped = int(suite.get("errors", 0)), int(suite.get("skipped", 0))
    return {"passed": tests - failures - errors - skipped, "failed": failures, "skipped": skipped, "errors": errors}


def git_commit() -> str:
    """The checkout's commit; a GPU machine's copy of the tree has no repository (``--commit`` then)."""
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty=+dirty"], cwd=ROOT, capture_output=True, text=True
        )
    except OSError:  # no git program there
        return "unknown (no git here)"
    return out.stdout.strip() or "unknown (no git here)"


def version_of(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} ({device})"
    return f"cpu: {platform_cpu()}"


def platform_cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, fn: Callable[[], Any]) -> tuple[float, Any]:
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t0, out


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# -- bandwidth -------------------------------------------------------------------------------
def copy_bandwidth(device: torch.device, nbytes: int, reps: int = 10) -> float:
    """GB/s of a device-to-device copy, counting bytes read + written (the best of ``reps``)."""
    buffers = torch.empty((2, nbytes), dtype=torch.uint8, device=device).fill_(1)
    buffers[1].copy_(buffers[0])  # warm
    best = min(timed(device, lambda: buffers[1].copy_(buffers[0]))[0] for _ in range(reps))
    return 2 * nbytes / best / 1e9


def decode_bound(model: torch.nn.Module, rows: int, prompt_len: int, new: int, bytes_per_s: float) -> float:
    """Tokens/s if each decode step only read the weights once and every row's KV cache (at its mean
    length over the run) at the measured bandwidth: the ceiling of a memory-bound decoder."""
    cfg = model.config
    weights = sum(p.numel() * p.element_size() for p in model.parameters())  # a tied matrix once
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    itemsize = next(model.parameters()).element_size()
    per_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * head_dim * itemsize
    mean_keys = prompt_len + (new - 1) / 2
    return rows * bytes_per_s / (weights + rows * per_token * mean_keys)


# -- rollout ---------------------------------------------------------------------------------
def hf_generate(model, ids: list[list[int]], group: int, new: int, static: bool) -> int:
    """``model.generate`` sampling ``group`` per prompt, exactly ``new`` tokens each; returns the tokens made."""
    x = torch.tensor(ids, device=model.device)
    kwargs: dict[str, Any] = dict(
        input_ids=x,
        attention_mask=torch.ones_like(x),
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=new,
        min_new_tokens=new,
        num_return_sequences=group,
        pad_token_id=model.generation_config.pad_token_id,
    )
    if static:
        kwargs["cache_implementation"] = "static"  # compiled by generate itself on CUDA (transformers' auto-compile)
    with torch.inference_mode():
        out = model.generate(**kwargs)
    return int(out.shape[0] * (out.shape[1] - x.shape[1]))


def rollout_shape(check, shape: str, prompts: int, group: int, prompt_len: int, new: int) -> dict:
    """Every contender on one shape: a warm-up at full size, then ``reps`` timed runs (medians)."""
    load_plugins([str(EXAMPLE_PLUGIN)])
    from trinity_like.registry import ROLLOUT_ENGINE

    device, reps = check.device, (1 if check.tiny else 2)
    dtype = precision(device).rollout
    model = shaped_model(shape, device=device, dtype=dtype)
    tokenizer = build_tiny_tokenizer()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (prompts, prompt_len), generator=g).tolist()
    rows = prompts * group
    bound = decode_bound(model, rows, prompt_len, new, check.results["bandwidth_gbs"] * 1e9)
    out: dict[str, Any] = {
        "rows": rows,
        "prompts": prompts,
        "group": group,
        "prompt_tokens": prompt_len,
        "new_tokens": new,
        "dtype": str(dtype).removeprefix("torch."),
        "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
        "decode_bound_tokens_per_s": bound,
        "contenders": {},
    }
    engine = NativeEngine(model, tokenizer)
    plugin = ROLLOUT_ENGINE.get("hf_generate").over(model, tokenizer)
    sp = SamplingParams(n=group, max_new_tokens=new, temperature=1.0, seed=1, stop_token_ids=())

    def ours() -> int:
        groups = engine.generate(ids, sp)
        return sum(len(s.token_ids) for grp in groups for s in grp)

    def through_plugin() -> int:
        groups = plugin.generate(ids, sp)
        return sum(len(s.token_ids) for grp in groups for s in grp)

    # (name, run, budget seconds it needs, timed repetitions); the plugin engine is generate with
    # a logits processor: warmed up by the plain generate before it, timed once.
    contenders = [
        ("ours", ours, 20, reps),
        ("generate", lambda: hf_generate(model, ids, group, new, static=False), 20, reps),
        ("generate_static_compiled", lambda: hf_generate(model, ids, group, new, static=True), 150, reps),
        ("hf_generate_engine", through_plugin, 20, 1),
    ]
    for name, fn, needs, times in contenders:
        if check.left() < needs:
            out["contenders"][name] = {"status": f"skipped: {check.left():.0f} s of the budget left, {needs} s needed"}
            continue
        torch.manual_seed(0)
        warm_s, made = timed(device, fn) if name != "hf_generate_engine" else (0.0, None)
        runs = [timed(device, fn) for _ in range(times)]
        made = runs[0][1]
        seconds = statistics.median(t for t, _ in runs)
        entry = {"tokens": made, "warmup_s": round(warm_s, 2), "seconds": seconds, "tokens_per_s": made / seconds}
        entry["fraction_of_bound"] = entry["tokens_per_s"] / bound
        if name == "generate_static_compiled":
            entry["compiled"] = getattr(model, "_compiled_call", None) is not None
        if name == "ours":
            entry.update(engine.workspace_stats())
        out["contenders"][name] = entry
    ours_rate = out["contenders"]["ours"].get("tokens_per_s")
    for entry in out["contenders"].values():
        if ours_rate and entry.get("tokens_per_s"):
            entry["ours_over_this"] = ours_rate / entry["tokens_per_s"]
    engine.release_memory()
    return out  # the model goes with this frame (the caller frees the device's cache)


# -- training --------------------------------------------------------------------------------
def folder_of(check, shape: str) -> Path:
    path = check.work / f"shape-{shape}"
    return path if (path / "config.json").is_file() else shaped_folder(shape, path)


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


def train_step(check, shape: str, rows: int, group: int, prompt_len: int, response_len: int, micro_batch: int) -> dict:
    from transformers import AutoModelForCausalLM

    from trinity_like.trainer.local_engine import LocalEngine
    from trinity_like.trainer.params import ModelParams, OptimParams

    device, reps = check.device, (1 if check.tiny else 3)
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


def grpo_run(check, shape: str) -> dict:
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
    cmd = [sys.executable, "-c", NO_RAY, "run", "--config", str(RECIPE), *overrides]
    t0 = time.perf_counter()
    proc = subprocess.run(
        cmd, cwd=ROOT, env=plugin_env(), capture_output=True, text=True, timeout=max(30.0, check.left())
    )
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


def parity(check) -> dict:
    """One tiny GRPO step on the device against the same step on the CPU: losses and updated weights."""
    from trinity_like.trainer.local_engine import LocalEngine
    from trinity_like.trainer.params import ModelParams, OptimParams

    folder = folder_of(check, "tiny")
    objective = grpo_objective(folder)
    batch = grpo_batch(400, 8, 4, 16, 24)
    device = str(check.device)
    out: dict[str, Any] = {"device": device, "reference": "cpu"}
    if check.device.type == "cpu":
        out["status"] = "the device is the CPU: CPU against CPU, the code runs, nothing is compared"
    for dtype in ("float32", "auto"):
        engines = {
            side: LocalEngine(
                ModelParams(path=str(folder), micro_batch_size=4, device=where, dtype=kind), OptimParams(lr=1e-3)
            )
            for side, where, kind in (("cpu", "cpu", "float32"), ("device", device, dtype))
        }
        before = engines["cpu"].state_dict()
        loss = {w: e.forward_backward(batch, objective)["loss"] for w, e in engines.items()}
        norm = {w: e.optim_step()["grad_norm"] for w, e in engines.items()}
        after = {w: e.state_dict() for w, e in engines.items()}
        update = max(float((after["cpu"][k] - before[k]).abs().max()) for k in before)
        diff = max(float((after["device"][k] - after["cpu"][k]).abs().max()) for k in before)
        ref, dev = loss["cpu"], loss["device"]
        entry = {"loss_cpu": ref, "loss_device": dev, "grad_norm_cpu": norm["cpu"], "grad_norm_device": norm["device"]}
        entry.update(max_update=update, max_weight_diff=diff)
        tol_loss, tol_w = (1e-4, 1e-3) if dtype == "float32" else (3e-2, 0.5)
        entry["close"] = abs(dev - ref) <= tol_loss * max(1.0, abs(ref)) and diff <= tol_w * update + 1e-7
        out[dtype] = entry
        for e in engines.values():
            e.close()
        if dtype == "float32" and not entry["close"]:
            out["status"] = "failed"
    return out


# -- the report ------------------------------------------------------------------------------
def write(report: dict, out: Path) -> str:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1, default=str))
    from gpu_check_report import markdown

    text = markdown(report)
    out.with_suffix(".md").write_text(text)
    return text
