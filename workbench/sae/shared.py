"""Interference shared by two models: match SAE features across models, compare their decoder geometry.

Two models have no common basis, so features are matched through what they mean: the MiniLM
embedding of each feature's description (its activating tokens, promoted tokens and contexts, all
plain text). A match is a mutual nearest neighbour whose description cosine is at least
``min_similarity``. For every pair (i, j) of model A whose two features both have matches
(i', j') in model B, B's interference |cos(W_B[i'], W_B[j'])| says whether B repeats A's
geometry. The null is the same quantity for random pairs of matched A features: if interference
were a per-model accident, A's interfering pairs would land on B's base rate.

A pair is *shared* when it is unrelated yet interfering in A and its counterpart interferes in B
(at least ``min_interference_b``); those are the pairs whose prompt-level probes the study replays
on both models.
"""

from __future__ import annotations

import numpy as np

from workbench.errors import WorkbenchError


def match_features(emb_a, feats_a, emb_b, feats_b, min_similarity: float = 0.6) -> dict[int, tuple[int, float]]:
    """Mutual nearest neighbours by description cosine: {feature of A: (feature of B, cosine)}."""
    A, B = np.asarray(emb_a, dtype=np.float64), np.asarray(emb_b, dtype=np.float64)
    if len(A) == 0 or len(B) == 0:
        raise WorkbenchError("feature matching needs described features in both SAEs: run `workbench sae features`")
    if A.shape[1] != B.shape[1]:
        raise WorkbenchError(f"description embeddings differ in width ({A.shape[1]} vs {B.shape[1]}): "
                             "embed both SAEs' descriptions with the same embedder")
    sim = A @ B.T
    best_b, best_a = sim.argmax(1), sim.argmax(0)
    out = {}
    for r, c in enumerate(best_b):
        if best_a[c] == r and sim[r, c] >= min_similarity:
            out[int(feats_a[r])] = (int(feats_b[c]), float(sim[r, c]))
    return out


def unit_rows(W) -> np.ndarray:
    W = np.asarray(W, dtype=np.float64)
    norms = np.linalg.norm(W, axis=1, keepdims=True)
    if not np.isfinite(W).all() or (norms == 0).any():
        raise WorkbenchError("the SAE decoder holds NaN, inf or zero rows: retrain or reload it")
    return W / norms


def counterpart_interference(pairs, matches: dict, Wb_unit: np.ndarray) -> list[dict]:
    """B's interference for each A pair whose features are both matched (others are left out)."""
    rows = []
    for p in pairs:
        i, j = int(p["i"]), int(p["j"])
        if i in matches and j in matches:
            (ib, si), (jb, sj) = matches[i], matches[j]
            if ib == jb:  # both matched to one B feature: no pair in B
                continue
            rows.append({**p, "i_b": ib, "j_b": jb, "match_i": si, "match_j": sj,
                         "interference_b": float(abs(Wb_unit[ib] @ Wb_unit[jb]))})
    return rows


def shared_interference(inter_a: dict, Wa, Wb, matches: dict, min_interference_b: float = 0.2,
                        n_null: int = 20000, seed: int = 0) -> dict:
    """Does B repeat A's interference? Counterparts of A's pairs vs random matched pairs, and the shared list.

    ``inter_a`` is A's interference map (``workbench sae interference``): its ``pairs`` (top-k
    partners, every bin) and ``unrelated_interfering`` lists. Returns the rows, a Spearman
    correlation between A's and B's interference over A's table, Mann-Whitney tests of B's
    interference (A's unrelated-interfering pairs vs the null) and the shared pairs.
    """
    from scipy.stats import mannwhitneyu, spearmanr

    Wa_unit, Wb_unit = unit_rows(Wa), unit_rows(Wb)
    matched = np.array(sorted(matches), dtype=np.int64)
    if len(matched) < 3:
        raise WorkbenchError(f"only {len(matched)} features matched across the models: lower min_similarity")
    rng = np.random.default_rng(seed)
    a, b = rng.choice(matched, n_null), rng.choice(matched, n_null)
    keep = a != b
    null = counterpart_interference([{"i": int(x), "j": int(y)} for x, y in zip(a[keep], b[keep], strict=True)],
                                    matches, Wb_unit)
    for r in null:
        r["interference"] = float(abs(Wa_unit[r["i"]] @ Wa_unit[r["j"]]))
    table = counterpart_interference(inter_a["pairs"], matches, Wb_unit)
    unrelated = counterpart_interference(inter_a["unrelated_interfering"], matches, Wb_unit)
    null_b = np.array([r["interference_b"] for r in null])
    unrel_b = np.array([r["interference_b"] for r in unrelated])

    def test(x):
        if len(x) < 2:
            return {"n": int(len(x)), "mean_b": float(x.mean()) if len(x) else float("nan"), "p": float("nan")}
        return {"n": int(len(x)), "mean_b": float(x.mean()), "median_b": float(np.median(x)),
                "rate_b": float((x >= min_interference_b).mean()),
                "p": float(mannwhitneyu(x, null_b, alternative="greater").pvalue)}

    rho = spearmanr([r["interference"] for r in table], [r["interference_b"] for r in table]) if len(table) > 2 else None
    shared = sorted((r for r in unrelated if r["interference_b"] >= min_interference_b),
                    key=lambda r: -min(r["interference"], r["interference_b"]))
    return {
        "n_matched": int(len(matched)), "min_interference_b": min_interference_b,
        "null": {"n": int(len(null_b)), "mean_b": float(null_b.mean()), "median_b": float(np.median(null_b)),
                 "rate_b": float((null_b >= min_interference_b).mean())},
        "unrelated_interfering": test(unrel_b),
        "table_spearman": {"n": len(table), "rho": float(rho.statistic) if rho else float("nan"),
                           "p": float(rho.pvalue) if rho else float("nan")},
        "rows": table, "unrelated_rows": unrelated, "shared": shared, "null_values": null_b.tolist(),
    }
