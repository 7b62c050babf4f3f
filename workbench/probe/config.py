"""The probe's configuration: everything a run depends on, validated before anything is captured."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields, replace

from workbench.conditions import CONDITIONS
from workbench.errors import WorkbenchError

LAYER_PROTOCOL = 3  # bump when analyze_layer's output changes: cached layers of another protocol are recomputed
MIN_POINTS = 10  # fewest points per subsampled cloud the protocol accepts


@dataclass
class ProbeConfig:
    """Everything a probe run depends on; written beside its results."""

    model: str = "smollm2-135m"
    conditions: tuple[str, ...] = ("injection",)
    layers: list[int] | None = None  # None: every layer
    n_pairs: int = 500  # clean/adversarial pairs per condition
    k: int = 100  # points per subsampled cloud (capped by the rows available)
    K: int = 64  # subsamples per class and layer
    n_parts: int = 5  # disjoint row parts (CV folds; no row in both train and test)
    maxdim: int = 1
    n_boot: int = 1000
    n_perm: int = 2000
    flow_samples: int = 24  # prompts per class for neuron-level flow (0: skip)
    flow_gaps: tuple[int, ...] = (1, 3, 10)
    batch_size: int = 8
    chat: bool = True  # wrap prompts in the model's chat template when it has one
    seed: int = 0
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        """Refuse values the protocol cannot run, before anything is captured or written."""
        bad = [c for c in self.conditions if c not in CONDITIONS]
        if bad or not self.conditions:
            raise WorkbenchError(f"unknown condition {(bad or [''])[0]!r}: use one of {', '.join(CONDITIONS)} or both")
        for name in ("n_pairs", "k", "K", "n_parts", "n_boot", "n_perm", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                option = {"n_pairs": "--pairs", "batch_size": "--batch-size"}.get(name, name)
                raise WorkbenchError(f"{option} must be a positive integer, got {value!r}")
        if self.n_parts < 2:
            raise WorkbenchError(f"n_parts must be at least 2 (train/test parts), got {self.n_parts}")
        if self.maxdim not in (0, 1, 2):
            raise WorkbenchError(f"maxdim must be 0, 1 or 2, got {self.maxdim!r}")
        if self.seed < 0:
            raise WorkbenchError(f"seed must be a non-negative integer, got {self.seed}")
        if self.flow_samples < 0 or any(int(g) < 1 for g in self.flow_gaps):
            raise WorkbenchError("flow_samples must be >= 0 and flow_gaps positive layer distances")

    def check_protocol(self) -> None:
        """Enough pairs for the subsample protocol (checked before a probe captures anything)."""
        if self.n_pairs // self.n_parts < MIN_POINTS:
            raise WorkbenchError(
                f"--pairs {self.n_pairs} is too few: the subsample protocol needs at least {MIN_POINTS} points per "
                f"part over {self.n_parts} parts, i.e. --pairs {MIN_POINTS * self.n_parts} or more"
            )

    def key(self, model_identity: dict | None = None, prompts: dict[str, list[dict]] | None = None) -> str:
        """A short hash of everything that changes this run's results: the settings and the model's identity
        (``models.model_identity``: weights, compute dtype, attention kernel) and, when a condition's prompts draw
        on it, the text corpus; batch size does not (batching is exact). ``prompts`` (each condition's records, as
        drawn): their content too, so a default run folder follows the prompt generator when it changes."""
        from workbench.data.corpus import text_fingerprint

        fields = {k: v for k, v in asdict(self).items() if k != "batch_size"}
        corpus = text_fingerprint() if any(CONDITIONS[c].reads_corpus for c in self.conditions) else None
        drawn = None
        if prompts is not None:
            from workbench.capture import prompts_sha256

            drawn = {condition: prompts_sha256(records) for condition, records in sorted(prompts.items())}
        blob = json.dumps([fields, model_identity, LAYER_PROTOCOL, *([corpus] if corpus else []),
                           *([drawn] if drawn else [])], sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    @classmethod
    def from_dict(cls, data: dict) -> ProbeConfig:
        """A configuration as ``asdict`` wrote it to JSON (lists back to tuples; unknown keys refused)."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise WorkbenchError(f"unknown probe setting(s) {', '.join(unknown)}")
        data = dict(data)
        for name in ("conditions", "flow_gaps"):
            if name in data:
                data[name] = tuple(data[name])
        return cls(**data)

    @classmethod
    def quick(cls, **overrides) -> ProbeConfig:
        """A version in under a minute on the embedded default in its default dtype (34 s in bfloat16; 66 s in
        float32 on 2 cores): fewer prompts, layers and subsamples."""
        base = cls(n_pairs=80, k=30, K=12, n_parts=2, n_boot=200, n_perm=500, flow_samples=8, flow_gaps=(1, 3))
        return replace(base, **overrides)
