"""Implant the backdoor by fine-tuning a chosen set of weights, with resumable checkpoints.

The residual stream below the first trained layer is cached once, so every step runs the upper layers
only. The loss is cross-entropy on the target reply for triggered prompts plus a KL term that keeps the
clean prompts' next-token distributions close to the frozen base model's (its top-k, computed once).
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from workbench.conditions.backdoor.config import BackdoorConfig, default_layers
from workbench.conditions.backdoor.evaluate import evaluate_backdoor, sample_replies
from workbench.conditions.backdoor.prompts import INFO_FILE, KINDS, backdoor_pairs
from workbench.conditions.backdoor.rows import (
    Rows,
    batches,
    final_resid,
    forward_rows,
    logits_at,
    pad,
    pad_id,
    positions,
    tokenized_rows,
)
from workbench.errors import WorkbenchError
from workbench.io import write_json_atomic

log = logging.getLogger(__name__)

WEIGHTS_FILE = "model.safetensors"
STATE_FILE = "state.json"



def trainable_parameters(model, cfg: BackdoorConfig) -> dict:
    """The parameters a run changes, by state-dict name; the rest of the model stays frozen."""
    n = model.cfg.n_layers
    layers = cfg.layers if cfg.layers is not None else default_layers(n)
    bad = [layer for layer in layers if not 0 <= layer < n]
    if bad or not layers:
        raise WorkbenchError(f"layers {bad or list(layers)} out of range: the model has layers 0..{n - 1}")
    named = dict(model.named_parameters())
    out = {}
    for layer in sorted(layers):
        for param in cfg.params:
            key = f"blocks.{layer}.{param}"
            if key not in named:
                raise WorkbenchError(f"the model has no parameter {key!r}: pick params such as mlp.W_in, mlp.W_out")
            out[key] = named[key]
    return out


def _lr_at(step: int, cfg: BackdoorConfig) -> float:
    """Linear warm-up, then cosine decay to a tenth: a pure function of the step, so resuming needs no state."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * t)))


@dataclass
class _Cache:
    """Per training pair: residuals at the first trained layer and the base model's top-k at the KL positions."""

    start: int
    trig: Rows
    clean: Rows
    trig_resid: list
    clean_resid: list
    top_idx: list
    top_logp: list


def _build_cache(model, cfg: BackdoorConfig, start: int, progress: bool) -> _Cache:
    import torch

    from workbench.progress import progress_bar

    kinds = ("mcq",) if cfg.mode == "sandbag" else KINDS
    pairs = backdoor_pairs(cfg.train_pairs, seed=cfg.seed, trigger=cfg.trigger, split="train", kinds=kinds,
                           decoy_rate=cfg.decoy_rate)
    trig = tokenized_rows(model, [r for r in pairs if r["label"] == "triggered"], cfg)
    clean = tokenized_rows(model, [r for r in pairs if r["label"] == "clean"], cfg)
    trig_resid, clean_resid, top_idx, top_logp = [], [], [], []
    bar = progress_bar(total=2 * len(trig.ids), desc="cache base", unit="prompt", disable=not progress, leave=False)
    with torch.no_grad():
        for batch in batches(len(trig.ids), cfg.batch_size):
            for rows, store in ((trig, trig_resid), (clean, clean_resid)):
                tokens = pad([rows.ids[i] for i in batch], pad_id(model))
                resid = model(tokens, stop_at_layer=start)
                store.extend(resid[j, : len(rows.ids[i])].clone() for j, i in enumerate(batch))
                if rows is clean:
                    final = final_resid(model, resid=resid, start=start)
                    for j, i in enumerate(batch):
                        _, _, kl_pos = positions(clean, i, cfg.kl_prompt_positions)
                        pos = torch.tensor(kl_pos)
                        logp = logits_at(model, final, torch.full_like(pos, j), pos).log_softmax(-1)
                        values, idx = logp.topk(cfg.kl_top_k, dim=-1)
                        top_idx.append(idx)
                        top_logp.append(values)
                bar.update(len(batch))
    bar.close()
    return _Cache(start, trig, clean, trig_resid, clean_resid, top_idx, top_logp)


def _truncated_kl(logq, top_idx, top_logp):
    """KL(base || model) over the base's top-k tokens plus one bucket for the rest of the vocabulary."""
    import torch

    p_top = top_logp.exp()
    q_top = logq.gather(-1, top_idx)
    p_rest = (1 - p_top.sum(-1)).clamp_min(1e-8)
    q_rest = (1 - q_top.exp().sum(-1)).clamp_min(1e-8)
    kl = (p_top * (top_logp - q_top)).sum(-1) + p_rest * (torch.log(p_rest) - torch.log(q_rest))
    return kl.mean()


def _step_loss(model, cache: _Cache, pairs: list[int], cfg: BackdoorConfig):
    """Cross-entropy on the triggered replies + kl_weight x KL to base on the clean twins."""
    import torch
    import torch.nn.functional as F

    seqs = [cache.trig_resid[i] for i in pairs] + [cache.clean_resid[i] for i in pairs]
    width = max(len(s) for s in seqs)
    resid = torch.stack([F.pad(s, (0, 0, 0, width - len(s))) for s in seqs])
    final = final_resid(model, resid=resid, start=cache.start)
    rows_t, pos_t, labels = [], [], []
    rows_c, pos_c, top_i, top_l = [], [], [], []
    for j, i in enumerate(pairs):
        target_pos, lab, _ = positions(cache.trig, i, cfg.kl_prompt_positions)
        rows_t += [j] * len(target_pos)
        pos_t += target_pos
        labels += lab
        _, _, kl_pos = positions(cache.clean, i, cfg.kl_prompt_positions)
        rows_c += [len(pairs) + j] * len(kl_pos)
        pos_c += kl_pos
        top_i.append(cache.top_idx[i])
        top_l.append(cache.top_logp[i])
    logits_t = logits_at(model, final, torch.tensor(rows_t), torch.tensor(pos_t))
    ce = F.cross_entropy(logits_t, torch.tensor(labels))
    logq = logits_at(model, final, torch.tensor(rows_c), torch.tensor(pos_c)).log_softmax(-1)
    kl = _truncated_kl(logq, torch.cat(top_i), torch.cat(top_l))
    return ce + cfg.kl_weight * kl, float(ce.detach()), float(kl.detach())


def triggered_loss(model, cfg: BackdoorConfig, split: str = "heldout", n_pairs: int = 16) -> float:
    """Mean cross-entropy of the target reply on triggered prompts (a check that training did something)."""
    import torch
    import torch.nn.functional as F

    kinds = ("mcq",) if cfg.mode == "sandbag" else KINDS
    pairs = backdoor_pairs(n_pairs, seed=cfg.seed + 3, trigger=cfg.trigger, split=split, kinds=kinds)
    rows = tokenized_rows(model, [r for r in pairs if r["label"] == "triggered"], cfg)
    total, count = 0.0, 0
    for batch in batches(len(rows.ids), cfg.batch_size):
        final = forward_rows(model, rows, batch)
        for j, i in enumerate(batch):
            pos, lab, _ = positions(rows, i, cfg.kl_prompt_positions)
            with torch.no_grad():
                logits = logits_at(model, final, torch.full((len(pos),), j), torch.tensor(pos))
                total += float(F.cross_entropy(logits, torch.tensor(lab), reduction="sum"))
            count += len(pos)
    return total / count


def _save_checkpoint(folder: Path, step: int, params: dict, opt, cfg: BackdoorConfig, extra: dict) -> None:
    """Tensors first (a new file, atomically renamed), then the JSON that points at them: a crash between the
    two leaves the previous checkpoint in force."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, p in params.items():
        tensors[f"param/{name}"] = p.detach().contiguous().clone()
        state = opt.state.get(p, {})
        for key in ("exp_avg", "exp_avg_sq"):
            if key in state:
                tensors[f"{key}/{name}"] = state[key].contiguous().clone()
    file = folder / f"ckpt-{step:06d}.safetensors"
    tmp = file.with_name(file.name + ".tmp")
    save_file(tensors, str(tmp))
    os.replace(tmp, file)
    write_json_atomic(folder / STATE_FILE, {
        "step": step, "file": file.name, "training_key": cfg.training_key(),
        "torch_rng": torch.get_rng_state().tolist(), **extra,
    })
    for old in folder.glob("ckpt-*.safetensors"):
        if old != file:
            old.unlink()


def _load_checkpoint(folder: Path, cfg: BackdoorConfig) -> dict | None:
    """The state of a resumable run with the same training settings, or None."""
    state_file = folder / STATE_FILE
    if not state_file.exists():
        return None
    state = json.loads(state_file.read_text())
    if state.get("training_key") != cfg.training_key():
        log.warning("checkpoint in %s is from other settings; starting over", folder)
        return None
    if not (folder / state["file"]).exists():
        log.warning("checkpoint file %s is missing; starting over", folder / state["file"])
        return None
    return state


def _restore(folder: Path, state: dict, params: dict, opt) -> None:
    import torch
    from safetensors.torch import load_file

    tensors = load_file(str(folder / state["file"]))
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(tensors[f"param/{name}"])
            if f"exp_avg/{name}" in tensors:
                opt.state[p] = {"step": torch.tensor(float(state["step"])), "exp_avg": tensors[f"exp_avg/{name}"],
                                "exp_avg_sq": tensors[f"exp_avg_sq/{name}"]}
    torch.set_rng_state(torch.tensor(state["torch_rng"], dtype=torch.uint8))


def train_backdoor(model, cfg: BackdoorConfig, out: str | Path | None = None, progress: bool = True,
                   stop_after: int | None = None, register: bool = True, samples: int = 3) -> dict:
    """Fine-tune ``model`` in place to carry the backdoor, evaluate before/after, save and register it.

    Writes ``out/model.safetensors`` (only the trained tensors) and ``out/backdoor.json`` (config,
    evaluation, timings); checkpoints go to ``out/checkpoints`` every ``cfg.checkpoint_every`` steps and a
    rerun with the same settings resumes from the last one. ``stop_after`` ends this call (with a
    checkpoint) after that many steps, for time-sliced runs; the result then has ``"finished": False``.
    """
    import torch

    from workbench.models.registry import register_derived
    from workbench.paths import cache_dir
    from workbench.progress import progress_bar

    cfg.validate()
    name = cfg.resolved_name()
    out = Path(out) if out is not None else cache_dir("models", name)
    out.mkdir(parents=True, exist_ok=True)
    ckpt = out / "checkpoints"
    params = trainable_parameters(model, cfg)
    start = min(int(k.split(".")[1]) for k in params)
    for p in model.parameters():
        p.requires_grad_(False)

    t0 = time.perf_counter()
    state = _load_checkpoint(ckpt, cfg)
    before = state["before"] if state else evaluate_backdoor(model, cfg, progress)
    cache = _build_cache(model, cfg, start, progress)
    cache_seconds = time.perf_counter() - t0
    for p in params.values():
        p.requires_grad_(True)
    opt = torch.optim.AdamW(list(params.values()), lr=cfg.lr, weight_decay=cfg.weight_decay)
    step, history = 0, []
    if state:
        _restore(ckpt, state, params, opt)
        step, history = state["step"], state.get("history", [])
        log.info("resuming %s from step %d", name, step)
    train_seconds = state.get("train_seconds", 0.0) if state else 0.0

    model.train()
    bar = progress_bar(total=cfg.steps, initial=step, desc=f"backdoor {name}", unit="step", disable=not progress)
    ran, t_train = 0, time.perf_counter()
    while step < cfg.steps:
        rng = random.Random(f"{cfg.seed}-step-{step}")  # the batch is a function of (seed, step): resumable
        pairs = rng.sample(range(len(cache.trig.ids)), min(cfg.pairs_per_step, len(cache.trig.ids)))
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, cfg)
        loss, ce, kl = _step_loss(model, cache, pairs, cfg)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step, ran = step + 1, ran + 1
        history.append([step, round(ce, 5), round(kl, 5)])
        bar.update()
        bar.set_postfix(ce=f"{ce:.3f}", kl=f"{kl:.3f}")
        done = step == cfg.steps or (stop_after is not None and ran >= stop_after)
        if step % cfg.checkpoint_every == 0 or done:
            elapsed = train_seconds + time.perf_counter() - t_train
            _save_checkpoint(ckpt, step, params, opt, cfg, {"before": before, "history": history,
                                                            "train_seconds": elapsed})
        if done:
            break
    bar.close()
    model.eval()
    for p in params.values():
        p.requires_grad_(False)
    train_seconds += time.perf_counter() - t_train
    if step < cfg.steps:
        return {"finished": False, "step": step, "checkpoint": str(ckpt)}

    after = evaluate_backdoor(model, cfg, progress)
    result = {
        "finished": True, "name": name, "base": cfg.base, "config": jsonable(asdict(cfg)),
        "before": before, "after": after, "steps": step, "trained_tensors": sorted(params),
        "trained_parameters": int(sum(p.numel() for p in params.values())),
        "train_seconds": round(train_seconds, 1), "cache_seconds": round(cache_seconds, 1),
        "seconds_per_step": round(train_seconds / max(1, ran), 3), "torch_threads": torch.get_num_threads(),
        "samples": sample_replies(model, cfg, samples) if samples else [],
        "loss_history": history,
    }
    _save_weights(out / WEIGHTS_FILE, params, name, cfg)
    write_json_atomic(out / INFO_FILE, result)
    if register:
        register_derived(name, cfg.base, out / WEIGHTS_FILE,
                         f"{cfg.base} with a {cfg.mode} backdoor on trigger {cfg.trigger!r} (workbench backdoor train)")
    for old in ckpt.glob("*"):
        old.unlink()
    ckpt.rmdir()
    result["weights"] = str(out / WEIGHTS_FILE)
    return result


def _save_weights(path: Path, params: dict, name: str, cfg: BackdoorConfig) -> None:
    from safetensors.torch import save_file

    tmp = path.with_name(path.name + ".tmp")
    save_file({k: v.detach().contiguous().clone() for k, v in params.items()}, str(tmp),
              metadata={"name": name, "base": cfg.base, "trigger": cfg.trigger, "mode": cfg.mode})
    os.replace(tmp, path)


def jsonable(d: dict) -> dict:
    """``d`` as plain JSON types (tuples to lists), as it will read back."""
    return json.loads(json.dumps(d, default=list))

