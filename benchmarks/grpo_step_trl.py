"""TRL's contender in benchmarks/grpo_step.py: ``trl.GRPOTrainer`` (``use_cpu=True``) on the
workload, timed from ``on_step_begin`` to ``on_step_end``; ``model.generate`` and
``_generate_and_score_completions`` are wrapped to split generation / scoring from the
training pass.

TRL (``trl==1.16.0``, the ``bench`` extra) is loaded from ``$TRL_PATH`` when that folder
exists (default ``~/.cache/trinity-like-bench/trl-1.16.0``), else from the environment: see
grpo_step.py's docstring for why."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from harness import timed

TRL_PATH = Path(os.environ.get("TRL_PATH", "~/.cache/trinity-like-bench/trl-1.16.0")).expanduser()


def import_trl() -> Any:
    """``trl`` from its private folder if there is one (see grpo_step.py's docstring), else the installed one."""
    if TRL_PATH.is_dir() and str(TRL_PATH) not in sys.path:
        sys.path.insert(0, str(TRL_PATH))
    import trl

    return trl


def exact_match_reward(completions: list, answer: list, **_: Any) -> list[float]:
    """Our ``exact_match`` reward fn on TRL's conversational completions."""
    from trinity_like.explorer.rewards import exact_match

    return [exact_match(response=c[0]["content"], answer=a) for c, a in zip(completions, answer)]


class Trl:
    """``trl.GRPOTrainer`` on the workload; :meth:`steps` trains and returns one record per step."""

    def __init__(self, args: argparse.Namespace, out_dir: str) -> None:
        from datasets import Dataset
        from transformers import AutoModelForCausalLM, TrainerCallback

        from trinity_like.explorer.tasks import ArithmeticParams, arithmetic_tasks
        from trinity_like.models.resolve import load_tokenizer, resolve_model_path

        trl = import_trl()
        path = resolve_model_path(args.model)
        tokenizer = load_tokenizer(path)
        tokenizer.padding_side = "left"
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
        tasks = arithmetic_tasks(ArithmeticParams(), split="train", count=args.prompts * (args.steps + 2))
        data = Dataset.from_list([{"prompt": t.messages(), "answer": t.answer} for t in tasks])
        rows = args.prompts * args.group
        config = trl.GRPOConfig(
            output_dir=out_dir,
            use_cpu=True,
            bf16=args.precision == "bf16",
            per_device_train_batch_size=args.micro_batch,
            gradient_accumulation_steps=rows // args.micro_batch,
            num_generations=args.group,
            max_completion_length=args.max_new_tokens,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            beta=0.0,
            num_iterations=1,
            learning_rate=args.lr,
            lr_scheduler_type="constant",
            max_grad_norm=1.0,
            weight_decay=0.0,
            gradient_checkpointing=False,
            max_steps=args.steps + 1,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            seed=42,
            dataloader_num_workers=0,
        )
        self.records: list[dict[str, Any]] = []
        phases: dict[str, float] = {}
        records = self.records

        class Record(TrainerCallback):
            """One record per optimizer step: its time, phases, tokens and logged values."""

            def on_step_begin(self, args, state, control, **kw):
                phases.clear()
                self.t0 = time.perf_counter()

            def on_pre_optimizer_step(self, args, state, control, **kw):
                self.t_opt = time.perf_counter()

            def on_optimizer_step(self, args, state, control, **kw):
                phases["time/optim_step"] = time.perf_counter() - self.t_opt

            def on_step_end(self, args, state, control, **kw):
                m = {"time/step": time.perf_counter() - self.t0, **phases, "load1": os.getloadavg()[0]}
                m["time/train"] = m["train_s"] = m["time/step"] - m.get("time/rollout", 0.0)
                m["run_tokens_source"] = "real tokens of the rows"
                records.append(m)

            def on_log(self, args, state, control, logs=None, **kw):
                keep = ("completions/mean_length", "reward", "loss", "grad_norm")
                if logs and records:
                    records[-1].update({f"log/{k}": float(v) for k, v in logs.items() if k in keep})

        self.trainer = trl.GRPOTrainer(
            model=model,
            reward_funcs=exact_match_reward,
            args=config,
            train_dataset=data,
            processing_class=tokenizer,
            callbacks=[Record()],
        )
        self.trainer.model.generate = timed(self.trainer.model.generate, phases, "time/generate")
        generate_and_score = timed(self.trainer._generate_and_score_completions, phases, "time/rollout")

        def counted(inputs: Any) -> dict[str, Any]:
            """The batch every micro-batch is cut from (rows only: each keeps the full width)."""
            out = generate_and_score(inputs)
            prompt, completion = out["prompt_ids"], out["completion_ids"]
            real = float(out["prompt_mask"].sum() + out["completion_mask"].sum())
            phases.update(
                rows_trained=prompt.shape[0],
                real_tokens=real,
                run_tokens=real,
                padded_tokens=float(prompt.shape[0] * (prompt.shape[1] + completion.shape[1])),
            )
            return out

        self.trainer._generate_and_score_completions = counted
        self.params = sum(p.numel() for p in model.parameters())

    def steps(self, count: int) -> list[dict[str, Any]]:
        """Train; one record per optimizer step (``count``: the ``max_steps`` it was built with)."""
        self.trainer.train()
        return self.records

    def info(self) -> dict[str, Any]:
        return {"trl": import_trl().__version__}

    def close(self) -> None:
        pass
