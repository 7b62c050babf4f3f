"""Interference between SAE features: decoder geometry, semantic relatedness, co-activation, shared neurons.

Interference(i, j) = |cos(W_dec[i], W_dec[j])| (sign aside, two directions that overlap read into
each other), in raw residual coordinates or in the activations' whitened coordinates
(``GEOMETRIES``). All pairs are visited through ``workbench.kernels.distances.iter_distance_blocks`` (row blocks of
the cosine-distance matrix), keeping only the top-k partners of each feature and bin counts, so the
d_sae x d_sae matrix never exists. Semantic relatedness = cosine of description embeddings, grouped
by agglomerative clustering (average linkage, cosine distance) at the reference cutoffs.
"""

from __future__ import annotations

import numpy as np

from workbench.errors import WorkbenchError

BINS = (0.0, 0.1, 0.2, 0.3, 0.4, 1.0)
CUTOFFS = (0.40, 0.30, 0.20, 0.15)
NEURON_THRESHOLD = 0.2  # |cos(W_out[n], W_dec[j])| above which neuron n counts as connected to feature j
GEOMETRIES = ("raw", "whitened")  # coordinates the decoder cosine is measured in (see whitened_rows)


def _decoder(sae):
    import torch

    w = sae.W_dec.detach().float() if hasattr(sae, "W_dec") else torch.as_tensor(sae, dtype=torch.float32)
    if not torch.isfinite(w).all():
        raise WorkbenchError("the SAE decoder holds NaN or inf: retrain or reload it")
    return w


def whitened_rows(W, x):
    """Decoder rows in the whitened coordinates of activations ``x`` [tokens, d]: their plain cosines are
    cosines under the activations' inverse covariance.

    Why: an SAE trained on whitened inputs and folded back to raw coordinates has each row stretched by
    sqrt(eigenvalue) along every principal direction, so where one direction dominates the variance (Gemma 3's
    blocks.9: 55%) almost every pair of raw rows has a large cosine. Here an invertible linear change of the
    activations x -> x A, with the decoder folded the same way W -> W A, leaves every cosine unchanged: they no
    longer depend on how the SAE was trained.
    """
    import torch

    x = torch.as_tensor(x, dtype=torch.float64)
    if x.ndim != 2 or len(x) <= x.shape[1] or not torch.isfinite(x).all():
        raise WorkbenchError(f"whitened interference needs more finite activations than dimensions ({x.shape[1]}), "
                             f"got {len(x)}: collect more tokens or use the raw geometry")
    lam, V = torch.linalg.eigh(torch.cov((x - x.mean(0)).T))
    W = _decoder(W).double()
    return (W @ V * lam.clamp(min=float(lam.max()) * 1e-9).rsqrt()).float()


def store_sample(store, site: str, every: int = 16):
    """Every ``every``-th shard of ``site`` in an activation store, as one float64 tensor (deterministic)."""
    import torch

    shards = range(0, len(store.manifest["shards"]), every)
    return torch.cat([store.read_shard(i, [site]).tensors[site].double() for i in shards])


def check_geometry(geometry) -> None:
    if geometry not in GEOMETRIES:
        raise WorkbenchError(f"--geometry {geometry!r} is not one of {', '.join(GEOMETRIES)}")


def decoder_geometry(sae, geometry: str = "raw", store=None):
    """The decoder rows interference is measured on: raw, or whitened by ``store``'s activations at the SAE's site."""
    check_geometry(geometry)
    if geometry == "raw":
        return _decoder(sae)
    if store is None:
        raise WorkbenchError("whitened interference needs the SAE's activation store, and this SAE records none: "
                             "use --geometry raw or train it with `workbench sae train`")
    return whitened_rows(sae.W_dec.detach(), store_sample(store, sae.cfg.metadata.hook_name))


def check_interference_args(k, min_interference, cutoff, block_size: int = 1024) -> None:
    """Refuse values the scan or the pair filter would turn into a silently empty or wrong result."""
    from workbench.sae.train import check_int, check_number

    check_int("k", k, low=1)
    check_number("min_interference", min_interference, low=0, high=1)
    if cutoff not in CUTOFFS:
        raise WorkbenchError(f"--cutoff {cutoff!r} is not a clustering cutoff: use one of "
                             f"{', '.join(f'{c:.2f}' for c in CUTOFFS)}")
    check_int("block_size", block_size, low=1)


def interference_scan(sae, k: int = 32, block_size: int = 1024, bins=BINS) -> dict:
    """Top-k partners by |cos| for every feature, and the all-pairs histogram over ``bins`` (pairs i < j).

    ``sae`` may be a SAELens SAE or a (d_sae, d_in) decoder matrix. Memory: block_size x d_sae.
    """
    import torch

    from workbench.kernels.distances import iter_distance_blocks

    W = _decoder(sae)
    n = len(W)
    if not 1 <= k < n:
        raise WorkbenchError(f"k={k} partners asked, but the SAE has {n} features")
    edges = torch.tensor(bins, dtype=torch.float64)
    counts = torch.zeros(len(bins) - 1, dtype=torch.long)
    top_i = np.empty((n, k), dtype=np.int64)
    top_c = np.empty((n, k), dtype=np.float32)
    for s, e, dist in iter_distance_blocks(W, metric="cosine", block_size=block_size):
        cos = (1 - dist).abs().clamp(max=1.0)
        cos[:, s:e].fill_diagonal_(-1.0)
        c, i = torch.topk(cos, k, dim=1)
        top_i[s:e], top_c[s:e] = i.numpy(), c.numpy()
        upper = torch.arange(n)[None, :] > torch.arange(s, e)[:, None]  # each pair once
        vals = cos[upper].double()
        b = torch.bucketize(vals, edges[1:-1], right=True)
        counts += torch.bincount(b, minlength=len(counts))
    total = int(counts.sum())
    labels = [f"[{a:.1f},{b:.1f})" if b < 1 else f"[{a:.1f},1]" for a, b in zip(bins[:-1], bins[1:], strict=True)]
    return {"top_index": top_i, "top_cos": top_c, "bin_labels": labels, "bin_counts": counts.tolist(),
            "base_rates": [c / total for c in counts.tolist()], "n_pairs": total}


def semantic_clusters(embeddings, cutoffs=CUTOFFS) -> dict[float, np.ndarray]:
    """Cluster labels per cutoff (cosine distance, average linkage): same label = semantically related."""
    from sklearn.cluster import AgglomerativeClustering

    X = np.asarray(embeddings, dtype=np.float64)
    if len(X) < 2:
        raise WorkbenchError("semantic clustering needs at least 2 described features")
    out = {}
    for c in cutoffs:
        model = AgglomerativeClustering(n_clusters=None, metric="cosine", linkage="average", distance_threshold=c)
        out[float(c)] = model.fit_predict(X)
    return out


def pair_table(scan: dict, features, embeddings, clusters: dict, min_interference: float = 0.0) -> list[dict]:
    """Every (i, j) among the top-k lists of described features: interference, relatedness, cluster flags.

    ``features[r]`` is the feature whose description embedding is ``embeddings[r]``; pairs where
    either side is undescribed are left out. Each pair appears once (i < j).
    """
    pos = {int(f): r for r, f in enumerate(features)}
    E = np.asarray(embeddings)
    seen, rows = set(), []
    for i in pos:
        for j, c in zip(scan["top_index"][i], scan["top_cos"][i], strict=True):
            j = int(j)
            if j not in pos or c < min_interference:
                continue
            a, b = min(i, j), max(i, j)
            if (a, b) in seen:
                continue
            seen.add((a, b))
            row = {"i": a, "j": b, "interference": float(c),
                   "relatedness": float(E[pos[a]] @ E[pos[b]])}
            for cut, labels in clusters.items():
                row[f"same_cluster_{cut:.2f}"] = bool(labels[pos[a]] == labels[pos[b]])
            rows.append(row)
    return rows


def unrelated_interfering(pairs: list[dict], min_interference: float = 0.3, cutoff: float = CUTOFFS[0]) -> list[dict]:
    """Pairs that interfere (|cos| >= min_interference) yet sit in different clusters at ``cutoff``.

    Different clusters at the coarsest cutoff (0.40) means different clusters at every finer one.
    """
    check_interference_args(1, min_interference, cutoff)
    key = f"same_cluster_{cutoff:.2f}"
    out = [p for p in pairs if p["interference"] >= min_interference and not p[key]]
    return sorted(out, key=lambda p: -p["interference"])


def coactivation(sae, store, pairs, site: str | None = None, batch_size: int = 4096,
                 progress: bool = True) -> np.ndarray:
    """Per pair, P(both fire) / P(either fires) (Jaccard of firing sets) over the store's tokens.

    Counted from each token's few active features (the pairs among them, bincounted), never a [tokens, pairs]
    mask: with Gemma's 2M-token store and ~65k pairs that mask kept the study's interference step busy for over
    ten minutes."""
    import torch

    from workbench.progress import progress_bar

    site = site or sae.cfg.metadata.hook_name
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    d = int(sae.cfg.d_sae)
    pi, pj = torch.as_tensor(pairs[:, 0]), torch.as_tensor(pairs[:, 1])
    wanted, which = torch.unique(pi * d + pj, return_inverse=True)  # sorted keys of the pairs asked for
    both = torch.zeros(len(wanted), dtype=torch.long)
    fires = torch.zeros(d, dtype=torch.long)
    with torch.no_grad():
        shards = range(len(store.manifest["shards"]))
        for s in progress_bar(shards, desc="coactivation", unit="shard", disable=not progress):
            x = store.read_shard(s, [site]).tensors[site].float()
            for b in range(0, len(x), batch_size):
                active = sae.encode(x[b : b + batch_size]) > 0
                fires += active.sum(0)
                most = int(active.sum(1).max()) if len(active) else 0
                if most == 0 or not len(wanted):
                    continue
                on, idx = active.float().topk(most, dim=1)  # each token's active features first
                rows = max(1, 2**24 // most**2)  # tokens at a time: at most 16M candidate pairs
                for r in range(0, len(idx), rows):
                    i, o = idx[r : r + rows], on[r : r + rows] > 0
                    keys = (i[:, :, None] * d + i[:, None, :])[o[:, :, None] & o[:, None, :]]
                    at = torch.searchsorted(wanted, keys).clamp_(max=len(wanted) - 1)
                    both += torch.bincount(at[wanted[at] == keys], minlength=len(wanted))
    together = both[which]
    either = fires[pi] + fires[pj] - together
    return (together / either.clamp(min=1)).numpy()


def mlp_for_site(model, site: str) -> int:
    """The layer whose MLP writes into a residual site (``blocks.L.hook_resid_*``)."""
    parts = site.split(".")
    if len(parts) < 3 or parts[0] != "blocks" or not parts[1].isdigit():
        raise WorkbenchError(f"site {site!r} is not a blocks.L.* site: the neuron view needs a layer")
    L = int(parts[1])
    if site.endswith("hook_resid_pre"):
        L -= 1
    if L < 0:
        raise WorkbenchError(f"{site} precedes every MLP: no neurons write into it")
    return L


def neuron_connections(model, sae, layer: int | None = None, threshold: float = NEURON_THRESHOLD):
    """|cos(W_out[layer][n], W_dec[j])| for all neurons x features, and the boolean map above ``threshold``.

    A neuron "connects" to a feature when the direction it writes into the residual stream is
    aligned with the feature's decoder direction (the reference's weight > 0.2 criterion).
    """
    import torch

    layer = mlp_for_site(model, sae.cfg.metadata.hook_name) if layer is None else layer
    W_out = model.blocks[layer].mlp.W_out.detach().float()  # (d_mlp, d_model)
    C = torch.nn.functional.normalize(W_out, dim=1) @ torch.nn.functional.normalize(_decoder(sae), dim=1).T
    C = C.abs()
    return C, threshold < C


def shared_neurons(connected, pairs) -> np.ndarray:
    """Per pair, Jaccard overlap of the neuron sets connected to each feature."""
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    A = connected[:, pairs[:, 0]]
    B = connected[:, pairs[:, 1]]
    inter = (A & B).sum(0).float()
    union = (A | B).sum(0).float().clamp(min=1)
    return (inter / union).numpy()
