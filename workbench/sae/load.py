"""Load an SAE: a folder in SAELens format (ours or anyone's), a name under our cache, or a SAELens release.

Everything comes back as a ``sae_lens.SAE``, so the rest of the package never cares where it came from.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from workbench.errors import WorkbenchError
from workbench.paths import cache_dir


def trained_dir(name: str) -> Path:
    """Where ``workbench sae train`` keeps an SAE called ``name`` (user cache, never the repository)."""
    return cache_dir("saes", "trained") / name


def load_sae(name: str | Path, sae_id: str | None = None, model=None, device: str = "cpu", site: str | None = None):
    """``name``: a folder with ``cfg.json``, a trained name, or a SAELens release (with ``sae_id``).

    With ``model``, the SAE's site (``site``, else the hook its config records) must exist in it with width
    ``d_in`` (else one line says so); a ``site`` given is recorded on the SAE for the code that hooks it.
    """
    from sae_lens import SAE

    path = Path(name)
    if not (path / "cfg.json").exists() and not sae_id:
        path = trained_dir(str(name)) if "/" not in str(name) else path
    if (path / "cfg.json").exists():
        try:
            sae = SAE.load_from_disk(str(path), device=device)
        except Exception as exc:  # a malformed folder or cfg.json: name it, do not dump SAELens internals
            what = f"missing field {exc}" if isinstance(exc, KeyError) else f"{type(exc).__name__}: {exc}"
            raise WorkbenchError(f"{path / 'cfg.json'} is not a loadable SAELens SAE config ({what}): "
                                 "re-save the SAE or point at another folder") from None
    else:
        sae = _from_release(str(name), sae_id, device)
    if site is not None:
        sae.cfg.metadata.hook_name = site
    if model is not None:
        from workbench.sae.train import check_site_matches

        check_site_matches(model, sae, site)
    return sae


def _from_release(release: str, sae_id: str | None, device: str):
    from sae_lens import SAE
    from sae_lens.loading.pretrained_saes_directory import get_pretrained_saes_directory

    releases = get_pretrained_saes_directory()
    if release not in releases:
        close = difflib.get_close_matches(release, list(releases), n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(close)}?" if close else "train one with `workbench sae train`"
        raise WorkbenchError(f"{release!r} is neither an SAE folder, a trained SAE, nor a SAELens release: {hint}")
    ids = list(releases[release].saes_map)
    if sae_id is None or sae_id not in ids:
        shown = ", ".join(ids[:4]) + (" ..." if len(ids) > 4 else "")
        raise WorkbenchError(f"release {release!r} needs an sae_id (one of {shown}); got {sae_id!r}")
    from unittest import mock

    import huggingface_hub.constants

    from workbench.models.loading import hub_reachable

    online = hub_reachable()
    try:  # offline: the hub client's own offline mode, so a cached release loads and a missing one fails at once
        with mock.patch.object(huggingface_hub.constants, "HF_HUB_OFFLINE", huggingface_hub.constants.HF_HUB_OFFLINE
                               or not online):
            return SAE.from_pretrained(release, sae_id, device=device)
    except Exception as exc:
        where = ("is not in the Hugging Face cache and the hub is unreachable" if not online
                 else f"could not be fetched from the Hugging Face hub ({type(exc).__name__})")
        raise WorkbenchError(f"SAELens release {release}/{sae_id} {where}: SAELens releases need the hub once; "
                             "offline, train one with `workbench sae train`") from None
