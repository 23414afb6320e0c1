"""The typed, immutable recipe schema: one class per section, one comment per field.

Every field has exactly one default: here, or -- for a field an engine's own params object
carries too -- on that params object, which the field reads it from (:func:`param_default`:
the trainer's and the explorer's params never read the recipe; it is turned into them in
:mod:`trinity_like.config.engine_params`). Unknown keys, wrong types and out-of-range
values are validation errors (the loader turns them into ``file:line: key.path: ...``).
Values a recipe does not set but an algorithm needs come from the algorithm's preset
(:mod:`trinity_like.config.resolve`), never from code that reads the config with a default.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from trinity_like.cpu_share import CpuThreads
from trinity_like.trainer.params import (
    AttnImplementation,
    Dtype,
    LoraParams,
    ModelParams,
    OptimParams,
    Scheduler,
    VerlParams,
)

PosInt = Annotated[int, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]
PosFloat = Annotated[float, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]
Prob = Annotated[float, Field(ge=0, le=1)]
Device = Annotated[str, Field(pattern=r"^(auto|cpu|cuda(:\d+)?)$")]  # auto: CUDA when torch sees one, else CPU
NAME_PATTERN, NAME_MAX = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*"), 100  # a run or stage name: one folder name


def check_name(value: str) -> str:
    """``value`` if it is a run or stage name: one folder name of ASCII letters, digits, ``_``,
    ``-`` and ``.``, not starting with ``.`` or ``-`` (so never ``.``, ``..`` or hidden), at most
    ``NAME_MAX`` characters; else ValueError. No ``/``, control character or absolute path can
    take a run directory out of ``run_root`` (or make it ``run_root`` itself)."""
    if not isinstance(value, str) or len(value) > NAME_MAX or not NAME_PATTERN.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a run or stage name: one folder name of letters, digits, '_', '-' and '.', "
            f"not starting with '.' or '-', at most {NAME_MAX} characters"
        )
    return value


def _check_run_path(value: str) -> str:
    """A run name, or ``<run>/<stage>`` (what a stage of a multi-stage recipe runs under)."""
    for part in value.split("/", 1) if value.count("/") == 1 else [value]:
        check_name(part)
    return value


Name = Annotated[str, AfterValidator(check_name)]
RunPath = Annotated[str, AfterValidator(_check_run_path)]


def field_default(section: type[BaseModel], name: str) -> Any:
    """The default of ``section.name`` (the client's settings take theirs from here)."""
    return section.model_fields[name].default


def param_default(params: type, name: str) -> Any:
    """The default of the field ``name`` of an engine's params dataclass: a recipe field that
    the engine's params carry too takes its default from there."""
    field = {f.name: f for f in dataclasses.fields(params)}[name]
    if field.default is dataclasses.MISSING:
        raise TypeError(f"{params.__name__}.{name} has no default")
    return field.default


class Section(BaseModel):
    """Base of every section: frozen, unknown keys forbidden, no type coercion."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ModelConfig(Section):
    path: str = "smollm2-135m-instruct"  # built-in id (see `trinity-like list models`) or a local HF folder
    dtype: Dtype = param_default(
        ModelParams, "dtype"
    )  # train engines; auto: bf16 compute over fp32 weights on CUDA and bf16 CPUs, else fp32 (docs/precision.md)
    max_prompt_tokens: PosInt = 256  # prompts longer than this are an error, not silently cut
    max_response_tokens: PosInt = 64  # upper bound on generated / trained response tokens
    critic_path: str | None = None  # initial weights of the value model (PPO); None: same as `path`
    attn_implementation: AttnImplementation = param_default(
        ModelParams, "attn_implementation"
    )  # attention kernel for HF models
    lora_rank: NonNegInt = (
        param_default(
            LoraParams, "rank"
        )  # LoRA adapter rank of the policy (Hu et al. 2021); 0: train every weight (a critic always does)
    )
    lora_alpha: PosFloat = (
        param_default(
            LoraParams, "alpha"
        )  # LoRA scale: updates are (alpha / rank) * B A; fixed 32 as Tinker, so lr barely moves with rank
    )
    lora_train_attn: bool = param_default(LoraParams, "train_attn")  # LoRA on the attention projections (q, k, v, o)
    lora_train_mlp: bool = param_default(LoraParams, "train_mlp")  # LoRA on the MLP projections (gate, up, down)
    lora_train_unembed: bool = param_default(
        LoraParams, "train_unembed"
    )  # LoRA on the output layer (lm_head); a tied one is untied in the merged weights


class DatasetConfig(Section):
    """A data source: a file/folder read through `datasets`, or a built-in generator."""

    path: str | None = None  # JSONL / parquet file or folder; relative to the recipe's folder
    generator: str | None = (
        None  # TASK_SOURCE name (`trinity-like list task_source`); "<name>:<x>" sets generator_args.dataset
    )
    generator_args: dict[str, Any] = {}  # params of the task source (checked against its params dataclass)
    split: Literal["train", "eval"] = "train"  # generator split; "eval" never overlaps "train"
    size: PosInt | None = None  # number of rows to generate / keep (None: all, or the generator's default)
    prompt_key: str = "prompt"  # field holding the prompt text
    answer_key: str = "answer"  # field holding the reference answer (tasks)
    response_key: str = "response"  # field holding the response text (SFT prompt/response rows)
    messages_key: str = "messages"  # field holding chat messages (SFT rows in chat form)
    chosen_key: str = "chosen"  # preferred response (pairs)
    rejected_key: str = "rejected"  # dispreferred response (pairs)
    system_prompt: str | None = None  # system message prepended to text prompts (task sources: None = the source's own)
    shuffle: bool = True  # shuffle each epoch with `seed`
    seed: int = 0  # shuffling seed, and the seed a task source draws with
    epochs: PosInt = 1  # passes over the data before it is exhausted (offline algorithms)
    pairs_from_samples: PosInt | None = (
        None  # tasks -> pairs: N samples per task, answer vs the model's commonest wrong one
    )

    @model_validator(mode="after")
    def _one_source(self) -> DatasetConfig:
        if (self.path is None) == (self.generator is None):
            raise ValueError("set exactly one of `path` and `generator`")
        return self


class StorageConfig(Section):
    storage: str = "sqlite"  # BUFFER_STORAGE name: sqlite (persistent) | memory (bounded queue) | jsonl
    args: dict[str, Any] = {}  # params of that storage (e.g. sqlite `path`, memory `capacity`)


class BufferConfig(Section):
    tasks: DatasetConfig | None = None  # tasks the explorer answers (online algorithms)
    eval_tasks: DatasetConfig | None = None  # held-out tasks for evaluation (`bench` and periodic eval)
    train_data: DatasetConfig | None = None  # offline training data: SFT rows or preference pairs
    eval_data: DatasetConfig | None = None  # held-out offline data (SFT loss, pair accuracy)
    expert_data: DatasetConfig | None = None  # expert SFT rows mixed into RL batches (MIX)
    experience: StorageConfig = StorageConfig()  # where explored experiences wait for the trainer
    train_batch_size: PosInt | None = (
        None  # experiences (or pairs) per train step; None: explorer batch x group (offline algorithm types preset their own)
    )


class SamplingConfig(Section):
    temperature: NonNegFloat = 1.0  # 0 means greedy
    top_k: NonNegInt = 0  # 0 disables top-k
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0  # nucleus sampling mass; 1 disables it
    max_new_tokens: PosInt | None = None  # None: model.max_response_tokens
    stop: list[str] = []  # stop strings (the matched text is kept, generation ends there)
    stop_token_ids: list[int] = []  # stop tokens in addition to the tokenizer's eos


class ExplorerConfig(Section):
    placement: Literal["auto", "driver", "ray"] = "auto"  # where it runs; auto: a Ray actor when the trainer uses Ray
    dtype: Dtype = "auto"  # rollout weights and KV cache; auto: bf16 on CUDA and on CPUs with bf16 units, else fp32 (docs/precision.md)
    engine: str = (
        "native"  # ROLLOUT_ENGINE name (`trinity-like list rollout_engine`): our KV-cache engine, or a plugin's
    )
    batch_size: PosInt = 8  # prompts per explore step
    group_size: PosInt = 8  # samples per prompt (GRPO's G)
    max_concurrent: PosInt | None = (
        None  # sequences decoded at once (cache slots); None: 128 on CPU, one per sample on a GPU where memory allows
    )
    workflow: str = "math"  # WORKFLOW name
    workflow_args: dict[str, Any] = {}  # params of the workflow (the env workflow: env, env_args, limits)
    reward_fn: str = "exact_match"  # REWARD_FN name
    reward_args: dict[str, Any] = {}  # params of the reward fn
    eval_reward_fn: str | None = None  # REWARD_FN of held-out evaluation; None: reward_fn (accuracy needs 0/1)
    eval_reward_args: dict[str, Any] = {}  # params of eval_reward_fn
    gold_reward_fn: str | None = (
        None  # REWARD_FN of the true reward logged beside the trained one (reward/gold_mean), never trained on; None: eval_reward_fn when set and not reward_fn; "": off
    )
    gold_reward_args: dict[str, Any] = {}  # params of gold_reward_fn (gold_reward_fn None: eval_reward_args)
    reward_timeout_s: PosFloat = 10.0  # a reward call slower than this (CPU-starved time aside) fails, is retried
    reward_retries: NonNegInt = 1  # retries before the task is skipped and counted
    sampling: SamplingConfig = SamplingConfig()  # rollout sampling
    eval_sampling: SamplingConfig = SamplingConfig(temperature=0.0)  # evaluation: greedy by default


class OptimizerConfig(Section):
    lr: PosFloat = param_default(OptimParams, "lr")  # AdamW learning rate
    betas: tuple[float, float] = param_default(OptimParams, "betas")  # AdamW betas
    eps: PosFloat = param_default(OptimParams, "eps")  # AdamW epsilon
    weight_decay: NonNegFloat = param_default(OptimParams, "weight_decay")  # AdamW weight decay
    grad_clip: NonNegFloat = param_default(OptimParams, "grad_clip")  # max global grad norm; 0 disables clipping
    warmup_steps: NonNegInt = param_default(OptimParams, "warmup_steps")  # linear warm-up steps
    scheduler: Scheduler = param_default(OptimParams, "scheduler")  # LR after warm-up
    min_lr_ratio: Prob = param_default(OptimParams, "min_lr_ratio")  # cosine floor as a fraction of lr


class SamplerGapConfig(Section):
    """The bound on the sampler-trainer gap ``train/sampler_kl_k3`` (docs/precision.md), checked every RL step."""

    # Measured in the default bf16 (docs/precision.md): SmolLM2-135M 1.6e-3 (bf16 sampler, fp32
    # trainer) to 2.3e-3 (bf16 both); the random tiny test model, whose bf16 rounding is
    # relatively largest, 0.024-0.033. 0.1 leaves 3x over the worst of those and 40x over the real
    # model's: past it the samples are no longer the trainer's policy (a failed sync, wrong
    # weights), well past 1e-2, where docs/precision.md says to turn a rollout correction on.
    max_kl_k3: NonNegFloat | None = 0.1  # the bound; None: no bound (the gap is still logged)
    action: Literal["stop", "warn"] = (
        "stop"  # stop: the run ends with one line naming step, value and bound; warn: the run log says so and the run goes on
    )


class TrainerConfig(Section):
    engine: str = "verl"  # TRAIN_ENGINE name (`trinity-like list train_engine`): "verl" (FSDP workers via Ray) | "local" (in-process torch), or a plugin's
    total_steps: PosInt = 20  # training steps of this stage
    micro_batch_size: PosInt = param_default(
        ModelParams, "micro_batch_size"
    )  # rows per forward/backward (gradient accumulation inside a step)
    share_prompts: bool = (
        param_default(
            ModelParams, "share_prompts"
        )  # run each distinct prompt of a micro-batch once, its responses packed after it (same result)
    )
    gradient_checkpointing: bool = (
        param_default(
            ModelParams, "gradient_checkpointing"
        )  # keep only each layer's input, recompute the rest in backward: less memory, ~1/3 more compute
    )
    update_epochs: PosInt = 1  # passes over each batch (PPO epochs)
    optimizer: OptimizerConfig = OptimizerConfig()  # policy optimizer
    critic_optimizer: OptimizerConfig = OptimizerConfig(lr=1e-5)  # value model optimizer (PPO)
    max_nan_steps: NonNegInt = 3  # consecutive NaN losses tolerated (step skipped) before the run stops
    sampler_gap: SamplerGapConfig = SamplerGapConfig()  # what a sampler-trainer gap past its bound does
    max_restarts: NonNegInt = 2  # deaths of a verl worker or the explorer actor restarted inside the run from its latest checkpoint; one more ends it


class SynchronizerConfig(Section):
    method: Literal["auto", "memory", "checkpoint"] = (
        "auto"  # weights in memory (one process) or through files (<run_dir>/sync); auto: files in modes explore/train
    )
    interval: PosInt = 1  # sync weights to the explorer every `interval` train steps
    offset: NonNegInt = 0  # explorer may run this many steps ahead of the trainer (off-policy); >= 1 in mode both: it explores while the trainer trains
    sync_style: Literal["fixed", "explorer_driven"] = (
        "fixed"  # fixed: batch t uses the weights of step t-1-offset; explorer_driven: the newest when the explorer starts a batch (needs offset >= 1); docs/async.md
    )
    concurrent: bool = True  # offset >= 1 in mode both: explore in the background while the trainer trains; false: in turn (the reference loop)

    @model_validator(mode="after")
    def _driven_needs_room(self) -> SynchronizerConfig:
        if self.sync_style == "explorer_driven" and self.offset == 0:
            raise ValueError("sync_style: explorer_driven lets the explorer run ahead of the trainer: set offset >= 1")
        if self.sync_style == "explorer_driven" and not self.concurrent:
            raise ValueError(
                "sync_style: explorer_driven needs concurrent: true (in turn, the explorer never waits on newer weights)"
            )
        return self


class CheckpointConfig(Section):
    interval: PosInt = 10  # save every `interval` train steps (and at the end)
    keep_last: PosInt = 2  # checkpoints kept; older ones are deleted
    resume: bool = True  # continue from the latest checkpoint of the run directory


class MonitorConfig(Section):
    backends: list[str] = ["jsonl", "tensorboard"]  # MONITOR names
    eval_interval: NonNegInt | None = (
        None  # evaluate the held-out sets every N steps, at the start (eval_at_start) and the end; None: at the start and the end only; 0: never (as the client loop's eval_every)
    )
    eval_at_start: bool = True  # evaluate before the first step
    progress: bool = True  # progress bar with the latest figures on the terminal
    reward_hacking_window: PosInt = (
        3  # K: the gold reward falling over K steps while the learned one rises is a warning
    )
    stop_on_reward_hacking: bool = False  # then stop the run; the best-by-gold weights are kept in <run_dir>/best_gold
    rm_check_tasks: NonNegInt = 0  # RL with a gold reward: before step 1, answer this many held-out tasks and log the trained reward's AUC against the gold one (rm_check/*); 0: off


class ClusterConfig(Section):
    """Where the `verl` workers and the explorer actor run. There is no node count: the nodes are
    the Ray cluster's (`ray_address`); `placement` says whether the workers share one or spread."""

    device: Device = param_default(
        ModelParams, "device"
    )  # where every model of the run lives (train engine, explorer, env players, reward models): auto | cpu | cuda | cuda:N; the verl engine's GPUs are num_gpus
    ray_address: str | None = param_default(
        VerlParams, "ray_address"
    )  # existing Ray cluster ("ray://host:10001" or "auto"); None: start locally
    num_cpus: PosInt | None = param_default(VerlParams, "num_cpus")  # CPUs for a locally started Ray; None: all
    num_gpus: NonNegInt = 0  # GPUs of the `verl` engine's workers, one each (0 or trainer_workers); 0: CPU workers over gloo; more than the machine (or cluster) has: an error at start
    trainer_workers: PosInt | None = (
        None  # FSDP world size of the `verl` engine; None: num_gpus on GPUs, 1 on CPU (see `workers`)
    )
    placement: Literal["pack", "spread"] = param_default(
        VerlParams, "placement"
    )  # `verl` workers: pack: all on one node; spread: each on a node of its own (a multi-node cluster)
    explorer_threads: PosInt | None = None  # torch threads of the explorer actor; None: auto (Config.cpu_threads)
    trainer_threads: PosInt | None = None  # torch threads of each CPU `verl` worker; None: auto (Config.cpu_threads)

    @model_validator(mode="after")
    def _one_gpu_per_worker(self) -> ClusterConfig:
        if self.device == "cpu" and self.num_gpus:
            raise ValueError(
                f"device: cpu keeps every model on the CPU, but num_gpus: {self.num_gpus} asks for GPU verl workers"
            )
        if self.trainer_workers is not None and self.num_gpus not in (0, self.trainer_workers):
            raise ValueError(
                f"num_gpus must be 0 (CPU workers) or trainer_workers ({self.trainer_workers}): "
                f"each verl worker takes one GPU (got {self.num_gpus})"
            )
        return self

    @property
    def workers(self) -> int:
        """The `verl` engine's FSDP world size: ``trainer_workers`` when set, else one per GPU, and
        on CPU one worker with every core (measured fastest on CPU: two gloo ranks spend the
        step gathering parameters and reducing gradients over loopback; benchmarks/RESULTS.md)."""
        if self.trainer_workers is not None:
            return self.trainer_workers
        return self.num_gpus if self.num_gpus > 0 else 1


class AlgorithmConfig(Section):
    """Algorithm type plus per-slot overrides: ``{name: ..., <param>: ...}``."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    type: str = "grpo"  # ALGORITHM_TYPE name
    policy_loss: dict[str, Any] = {}  # {name?, params...} of the policy loss
    advantage: dict[str, Any] = {}  # {name?, params...} of the advantage fn
    kl_loss: dict[str, Any] = {}  # {name?, coef?, params...}: KL as a loss term
    kl_penalty: dict[str, Any] = {}  # {name?, coef?, params...}: KL as reward shaping
    entropy_loss: dict[str, Any] = {}  # {name?, coef?, params...}; `name: none` switches any slot off
    sample_strategy: dict[str, Any] = {}  # {name?, params...}
    value_loss: dict[str, Any] = {}  # {name?, params...}: the critic's loss (algorithms with a critic)
    rollout_correction: dict[
        str, Any
    ] = {}  # {name, params...}: ROLLOUT_CORRECTION entry applied to any policy loss (docs/precision.md)
    dynamic_sampling: bool | None = None  # drop groups whose rewards are all equal; None: the algorithm's choice


MODES = ("both", "explore", "train", "bench")


class StageConfig(Section):
    """One stage of a multi-stage recipe. Any top-level section may be overridden."""

    name: Name  # stage name, used for its run sub-directory
    mode: Literal["both", "explore", "train", "bench"] | None = None
    model: dict[str, Any] = {}
    algorithm: dict[str, Any] = {}
    buffer: dict[str, Any] = {}
    explorer: dict[str, Any] = {}
    trainer: dict[str, Any] = {}
    synchronizer: dict[str, Any] = {}
    checkpoint: dict[str, Any] = {}
    monitor: dict[str, Any] = {}


class Config(Section):
    """A whole recipe (one stage of it, after stage overrides are merged)."""

    name: RunPath = "run"  # run name (one folder name); the run directory is `<run_root>/<name>`
    run_root: str = "runs"  # parent folder of run directories, relative to the working directory
    mode: Literal["both", "explore", "train", "bench"] = "both"  # what this run does
    seed: int = param_default(VerlParams, "seed")  # seeds sampling, data order and init
    model: ModelConfig = ModelConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    buffer: BufferConfig = BufferConfig()
    explorer: ExplorerConfig = ExplorerConfig()
    trainer: TrainerConfig = TrainerConfig()
    synchronizer: SynchronizerConfig = SynchronizerConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    monitor: MonitorConfig = MonitorConfig()
    cluster: ClusterConfig = ClusterConfig()
    plugins: list[str] = []  # plugin modules, .py files or package folders to load
    stages: list[StageConfig] = []  # run one after another; each overrides the sections above

    def sync_method(self) -> str:
        """``synchronizer.method`` with ``auto`` resolved: files between processes, memory within one."""
        if self.synchronizer.method == "auto":
            return "checkpoint" if self.mode in ("explore", "train") else "memory"
        return self.synchronizer.method

    def cpu_threads(self) -> CpuThreads:
        """Torch threads of the explorer actor and of each CPU worker of the train engine (verl's).

        In turn each side has the cores to itself while it works: the explorer all of them, a
        trainer worker its share. When the explorer explores while CPU workers train (mode
        both, ``offset >= 1``, concurrent, an engine whose workers are Ray processes
        (``TrainEngineTraits.ray_workers``), a Ray started here) they share the cores
        (:mod:`trinity_like.cpu_share`): half to the explorer and the rest to the workers
        while both compute, every core to whichever computes alone. ``cluster.explorer_threads``
        / ``trainer_threads`` fix the widths instead."""
        from trinity_like.threads import cores_given
        from trinity_like.trainer.engines import train_engine_traits

        cpus = cores_given()  # the affinity mask and a cgroup quota, not the machine's count
        cores = min(self.cluster.num_cpus or cpus, cpus)  # Ray's logical CPUs may be more than the cores given
        sync, c = self.synchronizer, self.cluster
        beside = (
            self.mode == "both"
            and sync.offset >= 1
            and sync.concurrent
            and c.num_gpus == 0
            and c.ray_address is None
            and train_engine_traits(self.trainer.engine).ray_workers
        )
        explorer = max(1, cores // 2) if beside else cores
        trainer = max(1, (cores - explorer if beside else cores) // c.workers)
        if c.explorer_threads is not None or c.trainer_threads is not None:
            explorer, trainer = c.explorer_threads or explorer, c.trainer_threads or trainer
            return CpuThreads(explorer, trainer, explorer, trainer, False)
        return CpuThreads(explorer, trainer, cores, max(1, cores // c.workers), beside)

    def run_dir(self) -> str:
        import os

        return os.path.join(self.run_root, self.name)
