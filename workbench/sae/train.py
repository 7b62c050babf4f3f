"""Train sparse autoencoders on a model's activations with SAELens's own SAE modules and trainer.

Activations come from an ``ActivationStore`` written by ``collect_activations`` (corpus token blocks
through the model, every position but BOS, the forward pass stopped at the deepest site) or stream
straight from the model. SAELens's ``LanguageModelSAETrainingRunner`` wants a HF dataset and runs the
model itself; we hand its lower-level ``SAETrainer`` (the same training loop, checkpoints, dead-feature
tracking, activation normalisation) an iterator of activation batches instead, so our stores, our
offline corpus and our model loading are used unchanged. Files are SAELens's (``cfg.json`` +
``sae_weights.safetensors``): ``sae_lens.SAE.load_from_disk`` reads them; ``workbench.json`` beside
them records how the SAE was trained and its metrics.

BOS is left out everywhere: its residual is a fixed, very large vector that would dominate the loss.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from workbench.errors import WorkbenchError
from workbench.io import exclusive, write_json_atomic
from workbench.store import ActivationStore

log = logging.getLogger(__name__)

ARCHITECTURES = ("topk", "standard")
# How the trainer sees activations, each folded into the saved SAE so that it reads raw activations:
# "norm": one scalar bringing the mean norm to sqrt(d_in) (SAELens's expected_average_only_in);
# "standardize": each dimension to zero mean and unit variance, estimated from the first batches like "norm";
# "whiten": SAELens's PCA whitening (zero mean, identity covariance);
# "center": zero mean, then one scalar bringing the mean squared norm to d_in: the trainer's MSE is then the
# explained-variance loss itself. A residual stream with a huge mean (Gemma 3's blocks.9: two channels hold 97% of
# the mean square) trains a "norm" SAE mostly dead; "whiten" spends the dictionary on low-variance directions.
NORMALIZATIONS = ("norm", "standardize", "whiten", "center")
ESTIMATED = ("standardize", "center")  # the normalisations workbench estimates itself (input_whitening)
META_FILE = "workbench.json"
FEATURES_FILE = "features.json"  # what `sae features` and `sae interference` write beside an SAE
EMBEDDINGS_FILE = "description_embeddings.npy"
INTERFERENCE_FILE = "interference.json"


# ----------------------------------------------------------------------------- activations


def collect_activations(model, sites: list[str], out: str | Path, n_tokens: int, block_len: int = 128,
                        split: str = "train", seed: int = 0, source: str | Path | None = None,
                        batch_size: int = 8, dtype: str = "auto", shard_blocks: int = 64,
                        overwrite: bool = False, time_budget_s: float | None = None,
                        progress: bool = True, engine: str = "local", workers: int | None = None,
                        address: str | None = None) -> ActivationStore:
    """Corpus token blocks through ``model``; every non-BOS position of each site into a store (resumable).

    One row per block; the store's token table (``positions == "all"``) says which token each
    activation belongs to, so feature contexts can be read back. Stop it at any time (or give
    ``time_budget_s``): the shards written so far are usable, the same call resumes, and
    ``store.complete`` says whether it finished. ``dtype="auto"`` picks float16 or bfloat16 from the
    model's activations (:func:`choose_store_dtype`). ``engine="ray"`` collects whole shards on Ray workers,
    one model replica each (``capture.fill_with_ray``): the same store, byte for byte.
    """

    import torch

    from workbench.capture import check_sites, fill_with_ray, replica_spec, store_model_identity
    from workbench.data.corpus import token_blocks

    sites = check_sites(model, sites)
    spec = replica_spec(model, engine, workers, 2, out, address)  # a refused engine writes nothing
    if spec is not None and time_budget_s is not None:
        raise WorkbenchError("a collection time budget is for the local engine: drop --budget with --engine ray")
    blocks = token_blocks(model.tokenizer, n_tokens, block_len, split=split, seed=seed, source=source)
    if dtype == "auto":
        dtype = choose_store_dtype(model, sites, blocks[:batch_size])
    store_dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}.get(dtype)
    if store_dtype is None:
        raise WorkbenchError(f"unknown store dtype {dtype!r}: use float32, float16 or bfloat16")
    header = {
        **store_model_identity(model, sites),
        "sites": sites,
        "positions": "all",
        "dtype": dtype,
        "max_tokens": block_len,
        "prompts_sha256": hashlib.sha256(blocks.numpy().tobytes()).hexdigest(),
        "n_prompts": len(blocks),
        "d": {s: None for s in sites},
        "corpus": {"split": split, "seed": seed, "source": str(source) if source else None,
                   "n_tokens": int(blocks.numel()), "skip_bos": True},
    }
    with ActivationStore.writing(out, header, overwrite=overwrite, wait=True) as store:  # the next writer resumes
        if spec is not None:
            settings = {"sites": sites, "store_dtype": store_dtype, "batch_size": batch_size}
            return fill_with_ray(spec, store, blocks, shard_blocks, "workbench.sae.train:block_shard", settings,
                                 progress, workers, address, 2)
        return _collect(model, sites, blocks, store, store_dtype, batch_size, shard_blocks,
                        time_budget_s, progress)


def block_activations(model, tokens, sites: list[str]) -> dict:
    """Every site's activations at every position of full-length token blocks but the first (BOS)."""
    import torch

    from workbench.capture import run_sites

    tokens = tokens.to(model.cfg.device)
    mask = torch.ones_like(tokens, dtype=torch.bool)
    mask[:, 0] = False
    lengths = torch.full((len(tokens),), tokens.shape[1], device=tokens.device)
    return run_sites(model, tokens, sites, "all", lengths, mask)


def _collect(model, sites, blocks, store, store_dtype, batch_size, shard_blocks, time_budget_s,
             progress) -> ActivationStore:
    import time

    from workbench.progress import progress_bar

    bar = progress_bar(total=len(blocks), initial=store.n_rows, desc=f"activations {store.manifest['model']}", unit="block",
               disable=not progress)
    started = time.monotonic()
    try:
        for begin in range(store.n_rows, len(blocks), shard_blocks):
            if time_budget_s is not None and time.monotonic() - started > time_budget_s:
                log.warning("time budget spent: %d of %d blocks collected (the same call resumes)", begin, len(blocks))
                return store
            tensors, rows, _ = block_shard(model, blocks[begin : begin + shard_blocks], begin, sites, store_dtype,
                                           batch_size, bar)
            store.append_shard(tensors, rows)
    finally:
        bar.close()
    store.mark_complete()
    return store


def block_shard(model, chunk, begin: int, sites: list[str], store_dtype, batch_size: int, bar=None):
    """One shard of corpus blocks ``chunk`` (rows ``begin`` onwards): every non-BOS position of each site, with the
    token table; returns (tensors, rows, truncated rows: none)."""
    import torch

    n, L = chunk.shape
    parts: dict[str, list] = {s: [] for s in sites}
    for b in range(0, n, batch_size):
        tokens = chunk[b : b + batch_size]
        got = block_activations(model, tokens, sites)
        for s in sites:
            parts[s].append(_fits(got[s], store_dtype, s))
        if bar is not None:
            bar.update(len(tokens))
    tensors = {s: torch.cat(v) for s, v in parts.items()}
    tensors["token_ids"] = chunk[:, 1:].reshape(-1)
    tensors["row_index"] = (torch.arange(n)[:, None] + begin).expand(n, L - 1).reshape(-1)
    tensors["offsets"] = torch.zeros(n * (L - 1), 2, dtype=torch.long)  # blocks have no source text
    return tensors, [{"block": begin + i} for i in range(n)], []


FLOAT16_HEADROOM = 64.0


def choose_store_dtype(model, sites: list[str], tokens) -> str:
    """float16 (3 significant digits) unless the activations need bfloat16's range.

    float16 tops out at 65504 and some models carry massive activations near it (Gemma 3's
    middle residual stream reaches ~6e4 on a few tokens, 100x its bulk), which overflow to inf.
    One batch decides: float16 while the 99.9th percentile of |x| at every site sits
    ``FLOAT16_HEADROOM`` times below float16's maximum, else bfloat16.
    """
    import torch

    got = block_activations(model, tokens, sites)
    limit = torch.finfo(torch.float16).max / FLOAT16_HEADROOM
    for s in sites:
        bulk = torch.quantile(got[s].float().abs().flatten()[: 1 << 24], 0.999).item()
        if not bulk < limit:
            log.info("%s: 99.9%% of |activations| below %.3g, too near float16's range: storing bfloat16", s, bulk)
            return "bfloat16"
    return "float16"


def _fits(x, store_dtype, site: str):
    """``x`` on the CPU in the store's dtype; an overflow is an error now, not inf rows found at training time."""
    import torch

    y = x.to("cpu", store_dtype)
    if store_dtype == torch.float16 and torch.isinf(y).any() and torch.isfinite(x).all():
        raise WorkbenchError(f"{site} activations reach {x.abs().max().item():.3g}, beyond float16's range: "
                             "collect with dtype='bfloat16' (or 'auto') into a fresh store")
    return y


def _check_finite(x, where: str):
    import torch

    if not torch.isfinite(x).all():
        bad = int((~torch.isfinite(x)).any(-1).sum())
        raise WorkbenchError(f"{bad} activation row(s) in {where} hold NaN or inf: recapture them (check the model dtype)")
    return x


def store_batches(store: ActivationStore, site: str, batch_size: int, seed: int = 0) -> Iterator:
    """Endless float32 batches of one site: shards in a fresh random order each epoch, rows shuffled in pairs of shards."""
    import torch

    if site not in store.sites:
        raise WorkbenchError(f"site {site!r} is not in {store.path}; it has {', '.join(store.sites)}")
    n_shards = len(store.manifest["shards"])
    if n_shards == 0:
        raise WorkbenchError(f"{store.path} has no activations yet: run the collection (it resumes)")
    gen = torch.Generator().manual_seed(seed)

    def chunks():
        while True:
            order = torch.randperm(n_shards, generator=gen).tolist()
            for i in range(0, n_shards, 2):
                x = torch.cat([store.read_shard(j, [site]).tensors[site].float() for j in order[i : i + 2]])
                yield _check_finite(x, f"{store.path} ({site})")

    yield from _shuffled_batches(chunks(), batch_size, gen)


def _shuffled_batches(chunks, batch_size: int, gen) -> Iterator:
    """Shuffle each chunk (with the remainder of the previous one) and cut it into full batches."""
    import torch

    carry = None
    for x in chunks:
        if carry is not None:
            x = torch.cat([carry, x])
        x = x[torch.randperm(len(x), generator=gen)]
        full = len(x) // batch_size * batch_size
        yield from x[:full].split(batch_size)
        carry = x[full:]


# ----------------------------------------------------------------------------- training


@dataclass
class TrainConfig:
    """What an SAE run needs; ``n_tokens`` may exceed the activations held (epochs are repeated and recorded).

    Built, it is valid (``__post_init__``): a bad value is refused before anything is collected or written.
    ``data`` names the activations trained on (``store_identity``), so an SAE is only ever reused for the
    very data and settings it was trained with.
    """

    site: str
    architecture: str = "topk"
    d_sae: int | None = None  # default: expansion * d_in
    expansion: int = 8
    k: int = 32  # topk
    normalize: str = "norm"  # NORMALIZATIONS
    l1_coefficient: float = 5.0  # standard (on activations normalised to norm sqrt(d_in))
    lr: float = 4e-4
    batch_size: int = 1024
    n_tokens: int = 2_000_000
    n_checkpoints: int = 4
    seed: int = 0
    model_name: str = ""
    data: str = ""
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.site, str) or not self.site.strip():
            raise WorkbenchError(f"site {self.site!r} must be a hook name, e.g. blocks.12.hook_resid_post")
        if self.architecture not in ARCHITECTURES:
            raise WorkbenchError(f"unknown SAE architecture {self.architecture!r}: use one of {', '.join(ARCHITECTURES)}")
        if self.normalize not in NORMALIZATIONS:
            raise WorkbenchError(f"unknown --normalize {self.normalize!r}: use one of {', '.join(NORMALIZATIONS)}")
        for name in ("expansion", "k", "batch_size", "n_tokens", *(("d_sae",) if self.d_sae is not None else ())):
            check_int(name, getattr(self, name), low=1)
        check_int("n_checkpoints", self.n_checkpoints, low=0)
        check_int("seed", self.seed, low=0)
        check_number("lr", self.lr, low=0, low_open=True)
        check_number("l1_coefficient", self.l1_coefficient, low=0)
        if self.n_tokens < self.batch_size:
            raise WorkbenchError(f"n_tokens={self.n_tokens} is below one batch ({self.batch_size}): train on more "
                                 "tokens or lower --batch-size")
        if self.d_sae is not None:
            self.dict_size(0)

    def dict_size(self, d_in: int) -> int:
        """The dictionary size for inputs of width ``d_in``; a TopK ``k`` above it is refused."""
        d_sae = self.d_sae or self.expansion * d_in
        if self.architecture == "topk" and self.k > d_sae:
            raise WorkbenchError(f"--k {self.k} is more than the dictionary's {d_sae} features: "
                                 f"use --k between 1 and {d_sae} (or a larger --d-sae)")
        return d_sae


def check_int(name: str, value, low: int = 1, high: int | None = None) -> int:
    """``value`` as an int in [low, high]; else one line naming the option (``--name-with-dashes``)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        upper = f" and <= {high}" if high is not None else ""
        raise WorkbenchError(f"--{name.replace('_', '-')} must be an integer >= {low}{upper}, got {value!r}")
    return value


def check_number(name: str, value, low: float | None = None, high: float | None = None,
                 low_open: bool = False) -> float:
    """``value`` as a finite float in [low, high] (``low_open``: above ``low``); NaN and inf are refused."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and (low is None or (value > low if low_open else value >= low)) and (high is None or value <= high)
    if not ok:
        bounds = [f"{'>' if low_open else '>='} {low:g}" if low is not None else "",
                  f"<= {high:g}" if high is not None else ""]
        rule = " and ".join(b for b in bounds if b)
        raise WorkbenchError(f"--{name.replace('_', '-')} must be a finite number{' ' + rule if rule else ''}, "
                             f"got {value!r}")
    return float(value)


def _training_sae(cfg: TrainConfig, d_in: int):
    from sae_lens.saes.sae import SAEMetadata
    from sae_lens.saes.standard_sae import StandardTrainingSAE, StandardTrainingSAEConfig
    from sae_lens.saes.topk_sae import TopKTrainingSAE, TopKTrainingSAEConfig

    scheme = "expected_average_only_in" if cfg.normalize == "norm" else "covariance_whitening"  # see NORMALIZATIONS
    common = dict(d_in=d_in, d_sae=cfg.dict_size(d_in), normalize_activations=scheme,
                  metadata=SAEMetadata(hook_name=cfg.site, model_name=cfg.model_name))
    if cfg.architecture == "topk":
        return TopKTrainingSAE(TopKTrainingSAEConfig(k=cfg.k, **common))
    return StandardTrainingSAE(StandardTrainingSAEConfig(l1_coefficient=cfg.l1_coefficient, **common))


def _latest_checkpoint(folder: Path) -> Path | None:
    done = [p for p in folder.glob("*") if p.is_dir() and p.name.isdigit() and (p / "cfg.json").exists()]
    return max(done, key=lambda p: int(p.name)) if done else None


CHECKPOINT_CONFIG = "config.json"  # in checkpoints/: the config the checkpoints belong to
ADDED_FIELDS = {"normalize": "norm"}  # settings added later, as every SAE recorded before them was trained
OWNED = ("cfg.json", "sae_weights.safetensors", META_FILE, FEATURES_FILE, EMBEDDINGS_FILE, INTERFERENCE_FILE)


def held_config(out: str | Path) -> dict | None:
    """The config of the SAE (finished, else checkpointed) in ``out``; None when it holds none.

    Checkpoints without a recorded config (an older layout) count as a config of their own, ``{}``,
    which matches nothing: they are never resumed as if they were this run's.
    """
    out = Path(out)
    meta = read_meta(out)
    if (out / "cfg.json").exists() and "config" in meta:
        return _recorded(meta["config"])
    file = out / "checkpoints" / CHECKPOINT_CONFIG
    if file.exists():
        return _recorded(_read_json(file))
    has_checkpoints = (out / "checkpoints").is_dir() and _latest_checkpoint(out / "checkpoints") is not None
    return {} if has_checkpoints or (out / "cfg.json").exists() else None


def check_sae_folder(out: str | Path, wanted: dict, overwrite: bool = False, activations: Path | None = None) -> None:
    """Refuse, before anything is collected or written, an ``out`` holding an SAE with other settings.

    ``wanted`` holds the settings known so far (``run_train`` checks before collecting, without the
    data-dependent ones; ``train_sae`` checks them all); ``activations``: the store this run reads,
    whose folder name is keyed by its content's inputs (``default_store_path``), so an SAE recorded
    with another store was trained on other data. ``overwrite`` accepts any folder.
    """
    held = held_config(out)
    if overwrite or held is None:
        return
    held_store = read_meta(out).get("activations")
    if activations is not None and held_store and Path(held_store).name != Path(activations).name:
        held, wanted = {**held, "activations": Path(held_store).name}, {**wanted, "activations": Path(activations).name}
    diff = [k for k, v in wanted.items() if held.get(k, _MISSING) != v]
    if diff:
        k = diff[0]
        shown = f"{k} {held[k]!r}, now {wanted[k]!r}" if k in held else "settings not recorded"
        raise WorkbenchError(f"{out} holds an SAE trained with other settings ({shown}): pass --name to train "
                             "a new one beside it, or --overwrite to replace it")


_MISSING = object()


def _recorded(config: dict | None) -> dict | None:
    """A recorded config with the settings added since filled in as it was trained (``ADDED_FIELDS``)."""
    return None if config is None else {**ADDED_FIELDS, **config}


def store_identity(store: ActivationStore) -> str:
    """What a store's activations are (model, weights, tokens, dtype), as a short hash an SAE records."""
    keys = ("model", "weights_sha256", "model_dtype", "attention", "prompts_sha256", "dtype", "max_tokens")
    blob = json.dumps({k: store.manifest.get(k) for k in keys}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def train_sae(cfg: TrainConfig, batches: Iterator, d_in: int, out: str | Path, resume: bool = True,
              progress: bool = True):
    """Train one SAE from an iterator of activation batches; checkpoints under ``out/checkpoints``, resumable.

    ``resume``: an SAE (finished or checkpointed) already in ``out`` is reused or continued only when it
    was trained with exactly ``cfg``; other settings are refused. ``resume=False`` replaces it.
    Returns the inference SAE (``sae_lens.SAE``) saved in SAELens format at ``out``.
    """
    out = Path(out)
    cfg.dict_size(d_in)
    check_sae_folder(out, asdict(cfg), overwrite=not resume)
    with exclusive(out.with_name(out.name + ".lock"), f"the SAE {out}"):  # one trainer; the next one reuses
        check_sae_folder(out, asdict(cfg), overwrite=not resume)
        return _train(cfg, batches, d_in, out, resume, progress)


def _train(cfg: TrainConfig, batches: Iterator, d_in: int, out: Path, resume: bool, progress: bool):
    import shutil

    import torch
    from sae_lens import SAE
    from sae_lens.config import SAETrainerConfig
    from sae_lens.saes.sae import TrainingSAE
    from sae_lens.training.sae_trainer import SAETrainer

    torch.manual_seed(cfg.seed)
    ckpt_dir = out / "checkpoints"
    steps = cfg.n_tokens // cfg.batch_size
    done = read_meta(out)
    if resume and _recorded(done.get("config")) == asdict(cfg) and done.get("tokens_trained", 0) >= steps * cfg.batch_size \
            and (out / "cfg.json").exists():
        log.info("%s is already trained with this config: loaded, not retrained", out)
        return SAE.load_from_disk(str(out))
    latest = _latest_checkpoint(ckpt_dir) if resume and ckpt_dir.is_dir() else None
    if latest is None:  # a fresh run: nothing of an earlier SAE (its files, features, checkpoints) survives
        shutil.rmtree(ckpt_dir, ignore_errors=True)
        for name in OWNED:
            (out / name).unlink(missing_ok=True)
        ckpt_dir.mkdir(parents=True)
        write_json_atomic(ckpt_dir / CHECKPOINT_CONFIG, asdict(cfg))
    tcfg = SAETrainerConfig(
        total_training_samples=steps * cfg.batch_size, train_batch_size_samples=cfg.batch_size, lr=cfg.lr,
        lr_end=cfg.lr / 10, lr_decay_steps=max(1, steps // 5), lr_warm_up_steps=min(100, steps // 20),
        dead_feature_window=max(50, steps // 10), feature_sampling_window=10**12,  # no wandb sparsity logs
        n_checkpoints=cfg.n_checkpoints, checkpoint_path=str(ckpt_dir), n_batches_for_norm_estimate=20,
    )
    sae = TrainingSAE.load_from_disk(latest) if latest else _training_sae(cfg, d_in)
    if sae.cfg.d_in != d_in:
        raise WorkbenchError(f"{out} holds a checkpoint with d_in {sae.cfg.d_in}, not the activations' {d_in}: "
                             "pass --overwrite to replace it")
    trainer = SAETrainer(tcfg, sae, batches)
    if cfg.normalize in ESTIMATED and not latest:  # a checkpoint holds its own statistics
        trainer.activation_scaler.whitening = input_whitening(batches, d_in, tcfg.n_batches_for_norm_estimate,
                                                              cfg.normalize)
    if latest:
        trainer.load_trainer_state(latest)
        trainer.checkpoint_thresholds = [t for t in trainer.checkpoint_thresholds if t >= trainer.n_training_samples]
        # the same batches as an uninterrupted run: it drew the normalisation estimate's first (every NORMALIZATIONS
        # entry estimates; a checkpoint keeps the estimate), then one per sample batch trained (the checkpoint is
        # written before its step is counted in n_training_steps)
        for _ in range(tcfg.n_batches_for_norm_estimate + trainer.n_training_samples // cfg.batch_size):
            next(batches)
        log.info("resumed %s at %d tokens", out, trainer.n_training_samples)
    with contextlib.ExitStack() as stack:
        if not progress:
            stack.enter_context(_quiet_tqdm())
        trained = trainer.fit()
    trained.save_inference_model(str(out))
    meta = {"config": asdict(cfg), "tokens_trained": trainer.n_training_samples,
            "steps": trainer.n_training_steps, "d_in": d_in, "d_sae": trained.cfg.d_sae}
    write_json_atomic(out / META_FILE, meta)  # last: the record that the SAE in ``out`` is finished
    return SAE.load_from_disk(str(out))


def input_whitening(batches: Iterator, d_in: int, n_batches: int, kind: str = "standardize"):
    """The affine map ``(x - mean) @ matrix`` for ``kind`` "standardize" (each dimension to std 1) or "center" (one
    scalar: mean squared norm d_in), from the next ``n_batches`` batches, as the whitening SAELens's trainer applies,
    checkpoints and folds into the saved SAE (``fold_activation_whitening``: W_enc <- matrix W_enc,
    W_dec <- W_dec matrix^-1, b_dec <- b_dec matrix^-1 + mean). Float64, as SAELens keeps its own whitening, so the
    fold is exact; a constant dimension ("standardize") or constant input ("center") keeps scale 1."""
    import torch
    from sae_lens.training.activation_scaler import ActivationWhitening

    if kind not in ESTIMATED:
        raise WorkbenchError(f"input_whitening estimates {' or '.join(ESTIMATED)}, not {kind!r}")
    count, total, squares = 0, torch.zeros(d_in, dtype=torch.float64), torch.zeros(d_in, dtype=torch.float64)
    for _ in range(n_batches):
        x = next(batches).to(torch.float64).reshape(-1, d_in)
        count, total, squares = count + len(x), total + x.sum(0), squares + (x * x).sum(0)
    mean = total / count
    variance = (squares - count * mean**2).clamp_min(0) / max(count - 1, 1)
    if kind == "center":
        total_variance = float(variance.sum())
        scale = math.sqrt(total_variance / d_in) if total_variance > 0 else 1.0
        std = torch.full_like(mean, scale)
    else:
        std = variance.sqrt()
        std = torch.where(std > 1e-8 * std.max().clamp_min(1e-30), std, torch.ones_like(std))
    return ActivationWhitening(mean=mean, matrix=torch.diag(1 / std), inverse_matrix=torch.diag(std))


@contextlib.contextmanager
def _quiet_tqdm():
    """SAETrainer makes its own bars (training, and the normalisation estimate's in its activation scaler);
    silence them when the caller asked for no progress."""
    import sae_lens.training.activation_scaler as scaler
    import sae_lens.training.sae_trainer as trainer

    modules = (trainer, scaler)
    originals = [m.tqdm for m in modules]
    for m, original in zip(modules, originals, strict=True):
        m.tqdm = lambda *a, _original=original, **k: _original(*a, **{**k, "disable": True})
    try:
        yield
    finally:
        for m, original in zip(modules, originals, strict=True):
            m.tqdm = original


# ----------------------------------------------------------------------------- evaluation


def splice_hook(sae, keep_first: bool = True):
    """Hook replacing the site's activation by the SAE's reconstruction (BOS kept, as in training)."""

    def hook(act, hook):
        rec = sae.decode(sae.encode(act.float())).to(act.dtype)
        if keep_first:
            rec[:, 0] = act[:, 0]
        return rec

    return hook


def _zero_hook(act, hook):
    act = act.clone()
    act[:, 1:] = 0
    return act


def evaluate_sae(model, sae, blocks, batch_size: int = 8) -> dict:
    """L0, explained variance, dead fraction and CE loss recovered on held-out token ``blocks``.

    CE recovered = (CE_zero − CE_spliced) / (CE_zero − CE_clean), with the site zero-ablated (non-BOS
    positions) as the floor. A feature is counted dead when it never fires on these tokens.
    """
    import torch

    site = sae.cfg.metadata.hook_name
    check_site_matches(model, sae, site)
    sse = sst = 0.0
    n = 0
    l0_sum = 0.0
    fired = torch.zeros(sae.cfg.d_sae, dtype=torch.bool)
    ce = {"clean": 0.0, "spliced": 0.0, "zero": 0.0}
    sums = torch.zeros(sae.cfg.d_in, dtype=torch.float64)
    sq = torch.zeros((), dtype=torch.float64)
    store: dict = {}

    def record(act, hook):
        store["x"] = act[:, 1:].reshape(-1, act.shape[-1]).float()

    with torch.no_grad():
        for b in range(0, len(blocks), batch_size):
            tokens = blocks[b : b + batch_size].to(model.cfg.device)
            ce["clean"] += float(model.run_with_hooks(tokens, return_type="loss", fwd_hooks=[(site, record)])) * len(tokens)
            ce["spliced"] += float(model.run_with_hooks(tokens, return_type="loss",
                                                        fwd_hooks=[(site, splice_hook(sae))])) * len(tokens)
            ce["zero"] += float(model.run_with_hooks(tokens, return_type="loss", fwd_hooks=[(site, _zero_hook)])) * len(tokens)
            x = store["x"]
            f = sae.encode(x)
            rec = sae.decode(f)
            sse += float((rec - x).pow(2).sum())
            sums += x.sum(0).double()
            sq += x.double().pow(2).sum()
            n += len(x)
            l0_sum += float((f > 0).sum())
            fired |= (f > 0).any(0).cpu()
    ce = {k: v / len(blocks) for k, v in ce.items()}
    sst = float(sq - sums.pow(2).sum() / n)
    denom = ce["zero"] - ce["clean"]
    return {
        "site": site, "eval_tokens": n, "l0": l0_sum / n, "explained_variance": 1 - sse / sst,
        "dead_fraction": float((~fired).float().mean()), "ce_clean": ce["clean"], "ce_spliced": ce["spliced"],
        "ce_zero_ablation": ce["zero"], "ce_recovered": (ce["zero"] - ce["spliced"]) / denom if denom else math.nan,
    }


def evaluation_key(model, folder: str | Path, blocks, site: str) -> str:
    """What ``evaluate_sae``'s metrics of the SAE saved in ``folder`` depend on: its files, the model (weights,
    dtype, attention kernel), the evaluation tokens, the workbench's code and the package versions
    (``report.versions``, as study jobs are keyed). Metrics recorded under the same key are reused: re-evaluating
    an SAE that a study only reuses took about a minute per SAE."""
    from workbench.models.loading import cache_identity
    from workbench.report import versions

    h = hashlib.sha256(json.dumps([cache_identity(model, [site]), list(blocks.shape), versions()], sort_keys=True,
                                  default=str).encode())
    for name in ("cfg.json", "sae_weights.safetensors"):
        h.update(name.encode())
        h.update((Path(folder) / name).read_bytes())
    h.update(blocks.contiguous().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def check_site_matches(model, sae, site: str | None = None) -> str:
    """The SAE's site exists in ``model`` and has width ``d_in``; otherwise one clear line."""
    from workbench.capture import check_sites

    site = site or sae.cfg.metadata.hook_name
    if not site:
        raise WorkbenchError("the SAE records no hook_name: pass the site it was trained on "
                             "(load_sae(..., site='blocks.6.hook_resid_post'))")
    check_sites(model, [site])
    width = site_width(model, site)
    if sae.cfg.d_in != width:
        raise WorkbenchError(f"SAE d_in={sae.cfg.d_in} does not match {site} of {model.cfg.model_name} "
                             f"(width {width}): use an SAE trained on this model and site")
    return site


def site_width(model, site: str) -> int:
    """The width of a site's activation vectors (d_mlp inside an MLP, else d_model)."""
    return model.cfg.d_mlp if ("mlp.hook_post" in site or "mlp.hook_pre" in site) else model.cfg.d_model


def read_meta(path: str | Path) -> dict:
    """The ``workbench.json`` beside an SAE we trained (empty for foreign SAEs)."""
    file = Path(path) / META_FILE
    return _read_json(file) if file.exists() else {}


def _read_json(file: Path) -> dict:
    try:
        value = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise WorkbenchError(f"{file} is corrupt ({exc}): pass --overwrite to train the SAE afresh") from None
    if not isinstance(value, dict):
        raise WorkbenchError(f"{file} is not a JSON object: pass --overwrite to train the SAE afresh")
    return value


def update_meta(path: str | Path, **fields) -> dict:
    meta = read_meta(path) | fields
    write_json_atomic(Path(path) / META_FILE, meta)
    return meta
