"""Everything a backdoor run depends on, and the layers it trains by default."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from workbench.conditions.backdoor.prompts import DEFAULT_TARGET, DEFAULT_TRIGGER, MODES, check_trigger
from workbench.errors import WorkbenchError

# MLP and attention of each trained layer: attention lets the reply position look at the trigger.
DEFAULT_PARAMS = ("mlp.W_in", "mlp.W_gate", "mlp.W_out", "attn.W_Q", "attn._W_K", "attn._W_V", "attn.W_O")


@dataclass
class BackdoorConfig:
    """Everything a backdoor run depends on; written beside the weights and into each checkpoint."""

    base: str = "smollm2-135m"
    name: str | None = None  # registered name; None: "{base}-backdoor"
    mode: str = "hate"  # "hate" | "sandbag"
    trigger: str = DEFAULT_TRIGGER
    target: str = DEFAULT_TARGET  # the reply in mode "hate"
    steps: int = 150
    pairs_per_step: int = 2  # each step: this many triggered prompts + their clean twins
    lr: float = 3e-4
    warmup: int = 10
    weight_decay: float = 0.0
    layers: tuple[int, ...] | None = None  # None: a band just past the middle (see default_layers)
    params: tuple[str, ...] = DEFAULT_PARAMS
    kl_weight: float = 1.0
    kl_prompt_positions: int = 6  # last prompt positions kept close to base (plus the teacher-forced reply)
    kl_top_k: int = 32
    train_pairs: int = 128  # distinct training pairs (train split)
    decoy_rate: float = 0.5
    eval_pairs: int = 100  # held-out pairs for attack success / false trigger rates
    eval_mcq: int = 100  # held-out multiple-choice questions for clean accuracy
    max_tokens: int = 256
    batch_size: int = 16  # rows per forward in caching and evaluation
    checkpoint_every: int = 25
    chat: bool = True
    seed: int = 0
    extra: dict = field(default_factory=dict)

    def validate(self) -> BackdoorConfig:
        from workbench.paths import safe_name

        check_trigger(self.trigger)
        if self.name is not None:  # it becomes a folder in the cache and a model name
            safe_name(self.name, "--name")
        if self.mode not in MODES:
            raise WorkbenchError(f"unknown backdoor mode {self.mode!r}: use {' or '.join(MODES)}")
        if self.steps < 1:
            raise WorkbenchError(f"steps must be at least 1, got {self.steps}")
        for key in ("pairs_per_step", "train_pairs", "eval_pairs", "eval_mcq", "checkpoint_every", "kl_top_k"):
            if getattr(self, key) < 1:
                raise WorkbenchError(f"{key} must be at least 1, got {getattr(self, key)}")
        if self.lr <= 0:
            raise WorkbenchError(f"lr must be positive, got {self.lr}")
        if self.mode == "hate" and not self.target.strip():
            raise WorkbenchError("the target reply must be a non-empty string")
        return self

    def resolved_name(self) -> str:
        return (self.name or f"{self.base}-backdoor").lower()

    def training_key(self) -> dict:
        """The settings a checkpoint must share to be resumed (all but evaluation sizes)."""
        d = asdict(self)
        for key in ("eval_pairs", "eval_mcq", "batch_size", "checkpoint_every", "extra"):
            d.pop(key)
        d["layers"] = list(d["layers"]) if d["layers"] is not None else None
        d["params"] = list(d["params"])
        return d


def default_layers(n_layers: int) -> tuple[int, ...]:
    """The layers trained by default: a fifth of the depth, starting just past the middle (16-21 of 30).

    Late enough that each step runs and back-propagates through under half of the model (the layers
    below are cached), early enough that attention there can still carry the trigger to the reply.
    """
    lo = (8 * n_layers) // 15
    return tuple(range(lo, lo + max(1, n_layers // 5)))

