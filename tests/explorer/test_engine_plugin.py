"""The rollout-engine seam with a second real engine behind it: the example plugin's ``hf_generate``
(transformers' generate) built by the factory and by a recipe's ``explorer.engine``. The same
seeds give the native engine's samples: two independent implementations of one contract.

Runs in a subprocess: loading the plugin registers its names for the rest of a process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "plugins" / "example_plugin" / "src" / "example_plugin"


def run_py(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "RAY_AUTH_MODE": "disabled"},
    )


def test_hf_generate_samples_what_native_samples_and_serves_a_recipe(tmp_path):
    r = run_py(
        f"""
        import pytest, torch
        from trinity_like.plugins import load_plugins
        load_plugins([{str(EXAMPLE)!r}])
        from trinity_like.config.schema import Config
        from trinity_like.errors import TrinityError
        from trinity_like.experience import Task
        from trinity_like.explorer.engine_contract import RolloutEngine, SamplingParams, generate
        from trinity_like.explorer.engines import build_rollout_engine
        from trinity_like.config.engine_params import explorer_params, sampling_params
        from trinity_like.explorer.worker import ExplorerWorker
        from trinity_like.models.tiny import build_tiny_model

        folder = str(build_tiny_model("tiny", seed=0))
        other = build_tiny_model(seed=1)[0].state_dict()
        hf = build_rollout_engine("hf_generate", folder, device="cpu")
        native = build_rollout_engine("native", folder, device="cpu")
        assert isinstance(hf, RolloutEngine) and type(hf).__name__ == "GenerateEngine"
        tok = native.tokenizer
        prompts = [tok.encode(t) for t in ("What is 23 + 5?", "Hello", "7 * 8 =")]
        stops = (300, 301, 302, 303, 304, 305, 306, 307)

        def same(sp):
            a, b = generate(hf, prompts, sp), native.generate(prompts, sp)
            flat = lambda gs: [(s.prompt_index, s.sample_index, s.token_ids, s.finish_reason) for g in gs for s in g]
            assert flat(a) == flat(b), (flat(a), flat(b))
            for x, y in zip((s for g in a for s in g), (s for g in b for s in g)):
                assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs)) < 1e-4
            return flat(a)

        sampled = same(SamplingParams(n=3, max_new_tokens=16, seed=4, stop_token_ids=stops))
        assert {{r for *_, r in sampled}} == {{"stop", "length"}}, "the test needs both finishes"
        same(SamplingParams(n=2, max_new_tokens=12, seed=9, temperature=0.7, top_k=20, top_p=0.9))
        same(SamplingParams(greedy=True, max_new_tokens=10, stop_token_ids=()))
        text = tok.decode(native.generate(prompts[:1], SamplingParams(greedy=True, max_new_tokens=20, stop_token_ids=()))[0][0].token_ids)
        same(SamplingParams(greedy=True, max_new_tokens=20, stop_token_ids=(), stop_strings=(text[6:8],)))

        assert hf.update_weights(other) == 1 and native.update_weights(other) == 1
        same(SamplingParams(greedy=True, max_new_tokens=10, stop_token_ids=()))
        assert hf.weights_digest == native.weights_digest  # both computed from the weights held
        # (name, tensor) pairs, as verl streams them, load as the mapping does: the digest is the held weights'
        before = hf.weights_digest
        start = build_tiny_model(seed=0)[0].state_dict()
        assert hf.update_weights(iter(start.items())) == 2 and native.update_weights(iter(start.items())) == 2
        assert hf.weights_digest == native.weights_digest != before
        assert hf.update_weights(other.items()) == 3 and native.update_weights(list(other.items())) == 3
        assert hf.weights_digest == native.weights_digest == before
        with pytest.raises(TrinityError, match="given twice"):
            native.update_weights([*other.items(), *other.items()])
        same(SamplingParams(greedy=True, max_new_tokens=10, stop_token_ids=()))
        with pytest.raises(TrinityError, match="unexpected"):
            hf.update_weights({{**other, "nope": torch.zeros(1)}})

        config = Config.model_validate({{"model": {{"path": folder}}, "trainer": {{"engine": "local"}},
                                         "explorer": {{"engine": "hf_generate", "group_size": 2}}}})
        explorer = ExplorerWorker(explorer_params(config), folder)
        assert type(explorer.engine).__name__ == "GenerateEngine"
        tasks = [Task(prompt="What is 2 + 3?", answer="5", task_id="a"), Task(prompt="What is 4 + 4?", answer="8", task_id="b")]
        result = explorer.run(tasks, sampling_params(config, step=1))
        assert len(result.experiences) == 4 and all(e.response_tokens for e in result.experiences)
        print("ok")
        """,
        tmp_path,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    assert r.stdout.strip().endswith("ok")
