"""Interventions at four loci, all read through one set of next-token metrics.

A source feature ``i`` is pushed into the model in one of four ways, and the shift of the next-token
distribution is measured against a target feature ``j``'s token set (``j = i`` by default):

- ``feature``: add ``scale * unit(W_dec[i])`` to the SAE's site at every position;
- ``token``:   the gradient of ``f_i`` at its top-activating positions with respect to the input
  embedding (mean over its top contexts), normalised, added at the site with ``scale`` (needs no SAE
  at run time, hence transferable between models that share a tokenizer);
- ``prompt``:  prepend the feature's top-activating snippet (any non-zero scale prepends it once);
- ``neuron``:  multiply the MLP neurons connected to the feature (``|cos(W_out[n], W_dec[i])| >
  NEURON_THRESHOLD`` = 0.2, else its ``min_neurons`` most aligned) by ``1 + scale``.

``scale = 0`` leaves the model untouched at every locus. Hooks are TransformerLens hook functions on
named sites; ``intervene`` is the single entry point the CLI and the app call.
"""

from __future__ import annotations

import numpy as np

from workbench.capture import StopForward, forward_until_stopped
from workbench.errors import WorkbenchError
from workbench.sae.features import MARK, check_feature
from workbench.sae.interference import NEURON_THRESHOLD, mlp_for_site, neuron_connections

LOCI = ("feature", "token", "prompt", "neuron")


# ----------------------------------------------------------------------------- hook factories


def direction_hook(direction, scale: float):
    """Add ``scale * direction`` (unit-normalised) at every position of the hooked site."""
    import torch

    d = torch.nn.functional.normalize(torch.as_tensor(direction).float(), dim=0)

    def hook(act, hook):
        return act + scale * d.to(act.device, act.dtype)

    return hook


def feature_direction(sae, j: int):
    return sae.W_dec[check_feature(sae, j)].detach().float()


def token_gradient_direction(model, sae, j: int, contexts: list[list[int]]):
    """Mean over contexts of d f_j(last position) / d input-embedding(last position), unit norm (f_j pre-activation).

    Each context is the token ids of a top-activating row up to and including the activating token. The SAE
    is spliced in and f_j read at its ``hook_sae_acts_pre``: the encoder's own pre-activation (its input
    normalisation included), equal to the activation where the feature fires (ReLU, TopK) and with a gradient
    where a TopK or ReLU gate would zero it. Each pass stops there.
    """
    import torch

    from workbench.sae.splice import spliced

    j = check_feature(sae, j)
    if not contexts:
        raise WorkbenchError(f"feature {j} has no top-activating contexts: it never fired on the store")
    total = torch.zeros(model.cfg.d_model)
    with spliced(model, sae) as sites:
        for ids in contexts:
            grad = _embedding_gradient(model, j, sites["hook_sae_acts_pre"], ids)
            if grad is not None:
                total += grad
    if not torch.isfinite(total).all() or total.norm() == 0:
        raise WorkbenchError(f"the token gradient of feature {j} is zero or not finite at its top contexts")
    return total / total.norm()


def _embedding_gradient(model, j: int, site: str, ids: list[int]):
    """d (feature ``j`` at ``site``, last position) / d embedding(last position) for one context; the pass stops
    at ``site``."""
    import torch

    held: dict = {}

    def leaf(act, hook):
        act = act.detach().requires_grad_(True)
        held["embed"] = act
        return act

    def read(act, hook):
        held["f"] = act[0, -1, j].float()
        raise StopForward

    tokens = torch.tensor([ids], device=model.cfg.device)
    with torch.enable_grad():
        forward_until_stopped(model, tokens, [("hook_embed", leaf), (site, read)])
        if not held["f"].requires_grad:
            return None
        grad, = torch.autograd.grad(held["f"], held["embed"], allow_unused=True)
    return None if grad is None else grad[0, -1].float().cpu()


def neuron_hook(neurons, scale: float):
    """Multiply the chosen MLP neurons (``mlp.hook_post``) by ``1 + scale``."""
    import torch

    idx = torch.as_tensor(neurons, dtype=torch.long)

    def hook(act, hook):
        act = act.clone()
        act[..., idx] = act[..., idx] * (1 + scale)
        return act

    return hook


def connected_neurons(model, sae, j: int, threshold: float = NEURON_THRESHOLD, min_neurons: int = 4):
    """Neurons of the site's MLP connected to feature ``j`` (above ``threshold``, at least ``min_neurons``)."""
    import torch

    C, _ = neuron_connections(model, sae)
    col = C[:, check_feature(sae, j)]
    above = torch.nonzero(col > threshold).flatten()
    if len(above) >= min_neurons:
        return above.tolist()
    return torch.topk(col, min_neurons).indices.tolist()


def snippet(record: dict) -> str:
    """A feature's top-activating context as plain text (marks removed), for the prompt locus."""
    if not record.get("contexts"):
        raise WorkbenchError(f"feature {record.get('feature')} has no contexts: describe it first")
    return record["contexts"][0].replace(MARK[0], "").replace(MARK[1], "").replace("⏎", "\n")


# ----------------------------------------------------------------------------- the model side


def next_token_probs(model, texts: list[str], fwd_hooks=()):
    """Next-token distributions after each text (right-padded batch, read at each last real token)."""
    import torch

    from workbench.capture import pad_batch, tokenize

    ids, _, _ = tokenize(model, texts, model.cfg.n_ctx)
    lengths = torch.tensor([len(x) for x in ids])
    tokens = pad_batch(model, ids)
    with torch.no_grad():
        logits = model.run_with_hooks(tokens.to(model.cfg.device), fwd_hooks=list(fwd_hooks))
    last = logits[torch.arange(len(ids)), (lengths - 1).to(logits.device)].float()
    probs = torch.softmax(last, -1)
    if not torch.isfinite(probs).all():
        raise WorkbenchError("the intervention produced NaN logits: lower the scale")
    return probs.cpu()


def embedding_cosines(model, target_tokens) -> np.ndarray:
    """max over target tokens t̄ of cos(E_t, E_t̄), for every vocabulary token t (the weighted-cosine kernel)."""
    import torch

    E = torch.nn.functional.normalize(model.W_E.detach().float(), dim=1)
    T = torch.as_tensor(list(target_tokens), dtype=torch.long)
    if len(T) == 0:
        raise WorkbenchError("the target feature has an empty token set: pick a feature that fires")
    return (E @ E[T].T).max(1).values.cpu().numpy()


def next_token_metrics(p_before, p_after, target_tokens, cos_to_target=None, k: int = 30) -> dict:
    """Shift of one next-token distribution toward a target token set.

    KL(after ‖ before); weighted overlap = mass on the target set; weighted cosine
    Σ_t p(t)·max_t̄ cos(E_t, E_t̄) (needs ``cos_to_target`` from ``embedding_cosines``), with its
    relative change; top-k entry = target tokens in the after-top-k that were not in the before-top-k.
    """
    p = np.asarray(p_before, dtype=np.float64)
    q = np.asarray(p_after, dtype=np.float64)
    if p.shape != q.shape or p.ndim != 1:
        raise WorkbenchError(f"distributions must be 1-D and of equal size, got {p.shape} and {q.shape}")
    if not (np.isfinite(p).all() and np.isfinite(q).all()):
        raise WorkbenchError("a next-token distribution holds NaN or inf")
    T = np.asarray(sorted(set(int(t) for t in target_tokens)), dtype=np.int64)
    eps = 1e-12
    kl = float(np.sum(q * (np.log(q + eps) - np.log(p + eps))))
    k = min(k, len(p))
    top_b = set(np.argsort(-p, kind="stable")[:k].tolist())
    top_a = set(np.argsort(-q, kind="stable")[:k].tolist())
    entered = [int(t) for t in T if t in top_a and t not in top_b]
    out = {
        "kl": max(kl, 0.0),
        "overlap_before": float(p[T].sum()), "overlap_after": float(q[T].sum()),
        "entered_topk": len(entered) > 0, "n_entered_topk": len(entered),
        "top_before": [int(t) for t in np.argsort(-p, kind="stable")[:10]],
        "top_after": [int(t) for t in np.argsort(-q, kind="stable")[:10]],
    }
    out["overlap_delta"] = out["overlap_after"] - out["overlap_before"]
    if cos_to_target is not None:
        c = np.asarray(cos_to_target, dtype=np.float64)
        cb, ca = float(p @ c), float(q @ c)
        out.update(wcos_before=cb, wcos_after=ca, wcos_rel_change=(ca - cb) / abs(cb) if cb else 0.0)
    return out


def check_intervention_args(locus: str, scale) -> None:
    """A known locus and a finite scale (NaN or inf would poison every logit)."""
    from workbench.sae.train import check_number

    if locus not in LOCI:
        raise WorkbenchError(f"unknown locus {locus!r}: use one of {', '.join(LOCI)}")
    check_number("scale", scale)


def intervention(model, sae, locus: str, feature: int | None, scale: float, records: dict | None = None,
                 direction=None, neurons=None):
    """(fwd_hooks, prefix) for one intervention; ``direction``/``neurons`` override the feature's (baselines)."""
    check_intervention_args(locus, scale)
    site = sae.cfg.metadata.hook_name
    if feature is not None:
        feature = check_feature(sae, feature)
    if scale == 0:
        return [], ""
    if locus == "feature":
        d = feature_direction(sae, feature) if direction is None else direction
        return [(site, direction_hook(d, scale))], ""
    if locus == "token":
        if direction is None:
            rec = _record(records, feature)
            direction = token_gradient_direction(model, sae, feature, rec["gradient_contexts"])
        return [(site, direction_hook(direction, scale))], ""
    if locus == "prompt":
        return [], snippet(_record(records, feature)) + "\n"
    layer = mlp_for_site(model, site)
    neurons = connected_neurons(model, sae, feature) if neurons is None else neurons
    return [(f"blocks.{layer}.mlp.hook_post", neuron_hook(neurons, scale))], ""


def _record(records, j):
    if not records:
        raise WorkbenchError(f"feature {j} has no description record: run `workbench sae features` first")
    if j not in records:
        raise WorkbenchError(f"feature {j} has no description (it never fired on the SAE's activations): "
                             "pick a described feature (see features.json)")
    return records[j]


def intervene(model, sae, prompt: str, locus: str, feature: int, scale: float, target_feature: int | None = None,
              records: dict | None = None, k: int = 30, top_n: int = 10) -> dict:
    """Next-token distribution before/after one intervention and its shift toward the target feature.

    ``records``: ``{feature: record}`` from ``features.describe_features`` (needed for the token and
    prompt loci and for the target token set).
    """
    import torch

    feature = check_feature(sae, feature)
    target = feature if target_feature is None else check_feature(sae, target_feature)
    rec = _record(records, target)
    hooks, prefix = intervention(model, sae, locus, feature, scale, records)
    before = next_token_probs(model, [prompt])[0]
    after = next_token_probs(model, [prefix + prompt], hooks)[0]
    metrics = next_token_metrics(before.numpy(), after.numpy(), rec["token_set"],
                                 embedding_cosines(model, rec["token_set"]), k=k)
    dec = model.tokenizer.decode

    def top(p):
        v, i = torch.topk(p, top_n)
        return [{"token": dec([int(t)]), "id": int(t), "p": float(x)} for x, t in zip(v, i, strict=True)]

    return {"locus": locus, "feature": feature, "target_feature": target, "scale": scale, "prompt": prompt,
            "prefix": prefix, "before": top(before), "after": top(after),
            "target_tokens": rec["token_set_text"], **{m: v for m, v in metrics.items() if not m.startswith("top_")}}
