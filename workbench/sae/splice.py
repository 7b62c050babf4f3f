"""Splice an SAE into a model as hooks, so its features are sites like any other.

``spliced(model, sae)`` adds one permanent hook at the SAE's site that runs the SAE there, and registers the
SAE's own hook points under that site with sae-lens's names: ``{site}.hook_sae_input``, ``.hook_sae_acts_pre``,
``.hook_sae_acts_post``, ``.hook_sae_recons``, ``.hook_sae_error``, ``.hook_sae_output``. While spliced they
are in ``model.hook_dict``, so ``capture``, ``run_with_hooks`` and ``run_with_cache`` read and patch features
exactly like model activations, and ``model.workbench["splices"]`` says which SAE is in (a store captured
meanwhile records it, so it never resumes under another SAE); on exit the model is as it was.

With ``error_term`` (the default) what flows on is reconstruction + error, and exactly the site's activation
(bit for bit) unless a hook on the SAE's points changed something, in which case it is the changed
reconstruction plus the clean error; gradients flow through the SAE with the error held constant (as in
sae-lens). Without it the reconstruction replaces the activation. Hooks on the site itself added inside the
context run after the splice, so they see what flows on.

Why not ``HookedSAETransformer.add_sae``: our models are plain ``HookedTransformer``s; ``add_sae`` swaps the
site's hook point for a wrapper (the site stops being a site, and is a fresh hook point afterwards), and its
error term ``recons + (x - recons)`` is ``x`` only up to rounding. The SAE's hook points and the clean pass for
the error are sae-lens's own.
"""

from __future__ import annotations

import contextlib
import hashlib
import json

from workbench.errors import WorkbenchError

_SAE_OWN_POINTS = ("hook_sae_error", "hook_sae_output")  # called by the splice, not by sae.encode/decode
_ABSENT = object()


@contextlib.contextmanager
def spliced(model, sae, error_term: bool = True):
    """Run ``sae`` inside ``model`` at its site for the block; yields {hook point: full site name}.

    The SAE computes on its own device (activations are moved there and back), so a CPU-loaded SAE works
    with a GPU model.
    """
    from workbench.sae.train import check_site_matches

    site = check_site_matches(model, sae)
    meta = sae.cfg.metadata
    if getattr(meta, "hook_name_out", None) not in (None, site):
        raise WorkbenchError(f"the SAE reads {site} but writes {meta.hook_name_out} (a transcoder): only SAEs "
                             "that reconstruct their own site can be spliced")
    point = model.hook_dict[site]
    points = dict(sae.hook_dict)
    if any(name in point._modules for name in points):
        raise WorkbenchError(f"an SAE is already spliced at {site}: leave that splice before adding another")
    before = model.hook_dict, model.mod_dict, {p: p.name for p in points.values()}
    info = getattr(model, "workbench", _ABSENT)
    record = {"site": site, "error_term": bool(error_term), "sae_sha256": sae_sha256(sae)}
    handle = None
    try:
        for name, p in points.items():
            point.add_module(name, p)  # named {site}.{name} by the model's setup
        model.setup()
        held = info if isinstance(info, dict) else {}
        model.workbench = {**held, "splices": [*held.get("splices", []), record]}
        point.add_hook(_splice_hook(sae, error_term), is_permanent=True)
        handle = point.fwd_hooks[-1]
        yield {name: f"{site}.{name}" for name in points}
    finally:
        if handle is not None:
            handle.hook.remove()
            point.fwd_hooks = [h for h in point.fwd_hooks if h is not handle]
        for name in points:
            point._modules.pop(name, None)
        model.hook_dict, model.mod_dict, names = before
        for p, name in names.items():
            p.name = name
        if info is not _ABSENT:
            model.workbench = info
        elif hasattr(model, "workbench"):
            del model.workbench


def sae_sha256(sae) -> str:
    """What the SAE computes: its configuration (not where it lives) and its weights."""
    from workbench.models.loading import state_sha256

    cfg = {k: v for k, v in sae.cfg.to_dict().items() if k not in ("device", "metadata")}
    blob = json.dumps({"cfg": cfg, "weights": state_sha256(sae)}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _splice_hook(sae, error_term: bool):
    """The site's hook: the SAE's forward (hook points firing), returning what flows on."""
    import torch
    from sae_lens.saes.sae import _disable_hooks  # the clean pass HookedSAETransformer makes for its error

    inner = [p for name, p in sae.hook_dict.items() if name not in _SAE_OWN_POINTS]

    def hook(act, hook):
        x = act.to(sae.device)
        recons = sae.decode(sae.encode(x))
        if not error_term:
            return sae.hook_sae_output(recons.to(act.device, act.dtype))
        with torch.no_grad():
            if any(p.has_hooks(dir="fwd") for p in inner):  # a hook may have changed a feature: recompute clean
                with _disable_hooks(sae):
                    clean = sae.decode(sae.encode(x))
            else:
                clean = recons.detach()
            error = x.to(clean.dtype) - clean
        hooked = sae.hook_sae_error(error)
        # recons + error, written as act + (what hooks changed) so that it is exactly act when they changed nothing
        change = recons - clean if hooked is error else (recons - clean) + (hooked - error)
        return sae.hook_sae_output(act.detach() + change.to(act.device, act.dtype))

    return hook
