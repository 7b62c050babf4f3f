"""Interference map, clustering, co-activation/neuron views, and the four intervention loci on the tiny model."""

import numpy as np
import pytest
import torch

from workbench.errors import WorkbenchError

SITE = "blocks.1.hook_resid_post"


@pytest.fixture(scope="module")
def sae():
    from sae_lens.saes.sae import SAEMetadata
    from sae_lens.saes.topk_sae import TopKSAE, TopKSAEConfig

    torch.manual_seed(0)
    s = TopKSAE(TopKSAEConfig(d_in=64, d_sae=96, k=8, metadata=SAEMetadata(hook_name=SITE, model_name="tiny")))
    with torch.no_grad():
        s.W_dec.copy_(torch.randn(96, 64))
        s.W_enc.copy_(s.W_dec.T.clone())
    return s


def test_blocked_topk_interference_matches_brute_force(sae):
    from workbench.sae.interference import interference_scan

    scan = interference_scan(sae, k=5, block_size=17)  # blocks that do not divide d_sae
    W = torch.nn.functional.normalize(sae.W_dec.detach().double(), dim=1)
    C = (W @ W.T).abs()
    C.fill_diagonal_(-1)
    ref_c, ref_i = torch.topk(C, 5, dim=1)
    assert np.allclose(scan["top_cos"], ref_c.numpy(), atol=1e-5)
    assert (scan["top_index"][:, 0] == ref_i[:, 0].numpy()).mean() > 0.98
    iu = torch.triu_indices(96, 96, 1)
    vals = C[iu[0], iu[1]].numpy()
    ref_counts = np.histogram(vals, bins=[0, .1, .2, .3, .4, 1.0 + 1e-9])[0]
    assert scan["n_pairs"] == 96 * 95 // 2
    assert np.abs(np.array(scan["bin_counts"]) - ref_counts).max() <= 2  # float ties at bin edges
    assert abs(sum(scan["base_rates"]) - 1) < 1e-9


def test_interference_rejects_bad_k_and_nan(sae):
    from workbench.sae.interference import interference_scan

    with pytest.raises(WorkbenchError):
        interference_scan(sae, k=96)
    W = torch.randn(10, 4)
    W[2, 1] = float("nan")
    with pytest.raises(WorkbenchError):
        interference_scan(W, k=2)


def test_clustering_cutoffs_nest():
    from workbench.sae.interference import CUTOFFS, semantic_clusters

    rng = np.random.default_rng(0)
    centers = rng.normal(size=(4, 16))
    X = np.repeat(centers, 5, axis=0) + 0.05 * rng.normal(size=(20, 16))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    cl = semantic_clusters(X)
    assert list(cl) == list(CUTOFFS)
    n = [len(set(cl[c])) for c in CUTOFFS]
    assert n == sorted(n)  # finer cutoffs never give fewer clusters
    assert len(set(cl[0.40])) == 4  # the four planted groups
    for c in CUTOFFS:  # a fine cluster never straddles two coarse ones
        for lab in set(cl[c]):
            assert len(set(cl[0.40][cl[c] == lab])) == 1


def test_pair_table_and_unrelated_list(sae):
    from workbench.sae.interference import (
        interference_scan,
        pair_table,
        semantic_clusters,
        unrelated_interfering,
    )

    scan = interference_scan(sae, k=4)
    feats = list(range(0, 96, 2))
    E = np.random.default_rng(1).normal(size=(len(feats), 8))
    E /= np.linalg.norm(E, axis=1, keepdims=True)
    pairs = pair_table(scan, feats, E, semantic_clusters(E))
    assert pairs and all(p["i"] < p["j"] and p["i"] in feats and p["j"] in feats for p in pairs)
    assert len({(p["i"], p["j"]) for p in pairs}) == len(pairs)
    un = unrelated_interfering(pairs, min_interference=0.0)
    assert all(not p["same_cluster_0.40"] for p in un)
    assert [p["interference"] for p in un] == sorted((p["interference"] for p in un), reverse=True)


def test_neuron_and_coactivation_views(tiny, sae):
    from workbench.sae.interference import neuron_connections, shared_neurons

    C, conn = neuron_connections(tiny, sae)
    assert C.shape == (tiny.cfg.d_mlp, 96) and conn.dtype == torch.bool
    s = shared_neurons(conn, [[0, 0], [0, 1]])
    assert s[0] == pytest.approx(1.0) or conn[:, 0].sum() == 0
    assert 0 <= s[1] <= 1


# ----------------------------------------------------------------------------- interventions


def _records(tiny):
    ids = tiny.tokenizer("the river bank", add_special_tokens=False)["input_ids"]
    bos = [tiny.tokenizer.bos_token_id] if tiny.tokenizer.bos_token_id is not None else []
    rec = {"feature": 3, "contexts": ["the river «bank»"], "token_set": sorted(set(ids[-3:])),
           "token_set_text": ["x"], "gradient_contexts": [bos + ids]}
    return {3: rec}


@pytest.mark.parametrize("locus", ["feature", "token", "prompt", "neuron"])
def test_each_locus_shifts_and_zero_scale_is_identity(tiny, sae, locus):
    from workbench.sae.interventions import intervene

    recs = _records(tiny)
    zero = intervene(tiny, sae, "money and", locus, 3, 0.0, records=recs)
    assert zero["kl"] < 1e-8 and zero["before"] == zero["after"]
    moved = intervene(tiny, sae, "money and", locus, 3, 8.0, records=recs)
    assert moved["kl"] > 1e-4
    assert set(moved) >= {"overlap_before", "overlap_after", "wcos_rel_change", "entered_topk", "before", "after"}


def test_intervene_bad_inputs(tiny, sae):
    from workbench.sae.interventions import intervene

    recs = _records(tiny)
    for kwargs in ({"locus": "nope", "feature": 3}, {"locus": "feature", "feature": 96},
                   {"locus": "feature", "feature": -1}, {"locus": "prompt", "feature": 5}):
        with pytest.raises(WorkbenchError) as e:
            intervene(tiny, sae, "hello", scale=1.0, records=recs, target_feature=3, **kwargs)
        assert "\n" not in str(e.value)


def test_metrics_on_hand_made_distributions():
    from workbench.sae.interventions import next_token_metrics

    p = np.array([0.5, 0.3, 0.1, 0.1, 0.0])
    q = np.array([0.1, 0.1, 0.1, 0.2, 0.5])
    cos = np.array([0.0, 0.0, 0.5, 1.0, 1.0])
    m = next_token_metrics(p, q, target_tokens=[3, 4], cos_to_target=cos, k=2)
    assert m["overlap_before"] == pytest.approx(0.1) and m["overlap_after"] == pytest.approx(0.7)
    assert m["overlap_delta"] == pytest.approx(0.6)
    assert m["wcos_before"] == pytest.approx(0.15) and m["wcos_after"] == pytest.approx(0.75)
    assert m["wcos_rel_change"] == pytest.approx(4.0)
    assert m["entered_topk"] and m["n_entered_topk"] == 2  # tokens 4 and 3 replace 0 and 1
    eps = 1e-12
    assert m["kl"] == pytest.approx(float(np.sum(q * (np.log(q + eps) - np.log(p + eps)))))
    same = next_token_metrics(p, p, [3], cos, k=2)
    assert same["kl"] == pytest.approx(0, abs=1e-12) and not same["entered_topk"]
    with pytest.raises(WorkbenchError):
        next_token_metrics(p, q[:3], [0])
    with pytest.raises(WorkbenchError):
        next_token_metrics(p, np.full(5, np.nan), [0])


def test_transfer_trials_replay_prompt_probes_on_another_model(tiny):
    """Prompt-level probes of one model's pairs, measured on another (here a differently seeded tiny model)."""
    from workbench.commands.polysemantic import compare, map_tokens, transfer_trials
    from workbench.models.tiny import tiny_model

    other = tiny_model(seed=1)
    assert map_tokens(["a", "b", "ab", ""], other.tokenizer) == sorted(
        {other.tokenizer.encode(c, add_special_tokens=False)[0] for c in "ab"})
    texts = {0: "river water fish boat", 1: "money loan cash credit", 2: "stream bank river", 3: "zebra xylophone"}
    records = {f: {"feature": f, "contexts": [t], "token_set": [ord(c) for c in t[:3]],
                   "token_set_text": list(t[:3])} for f, t in texts.items()}
    pairs = {"interfering": [(0, 1, 0.5)], "related": [(0, 2, 0.2)], "low_interference": [(3, 1, 0.01)],
             "random": [(-1, 1, float("nan"))]}
    icfg = {"prompts": ["The next word is", "She said"], "topk": 10}
    rows = transfer_trials(other, records, pairs, icfg, np.random.default_rng(0))
    assert len(rows) == 8 and {r["condition"] for r in rows} == set(pairs)
    assert all(r["locus"] == "prompt" and r["kl"] > 0 and r["target_tokens"] == 3 for r in rows)
    stats = compare(rows, 50, np.random.default_rng(0))
    assert {s["baseline"] for s in stats} == {"random", "related", "low_interference"}


# ----------------------------------------------------------------------------- shared across models


def test_match_features_mutual_nearest_neighbours():
    from workbench.sae.shared import match_features

    a = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1.0]])
    b = np.array([[0, 0.8, 0.6], [0.99, 0.141, 0], [0, 0.6, 0.8]])  # A0~B1; A1 and A2 both like B0/B2
    got = match_features(a, [10, 11, 12], b, [20, 21, 22], min_similarity=0.7)
    assert got[10][0] == 21 and got[10][1] == pytest.approx(0.99)
    assert got[11] == (20, pytest.approx(0.8)) and got[12] == (22, pytest.approx(0.8))
    assert match_features(a, [10, 11, 12], b, [20, 21, 22], min_similarity=0.9) == {10: (21, pytest.approx(0.99))}
    with pytest.raises(WorkbenchError, match="same embedder"):
        match_features(a, [1, 2, 3], b[:, :2], [1, 2, 3])


def test_shared_interference_finds_repeated_geometry():
    """B = A rotated (same geometry, permuted features): every interfering pair repeats, far above the null."""
    from workbench.sae.shared import shared_interference

    rng = np.random.default_rng(0)
    Wa = rng.normal(size=(64, 16))
    Wa[1] = Wa[0] + 0.3 * rng.normal(size=16)  # an interfering pair
    Wa[3] = Wa[2] + 0.5 * rng.normal(size=16)
    Q, _ = np.linalg.qr(rng.normal(size=(16, 16)))
    perm = rng.permutation(64)
    Wb = np.empty_like(Wa)
    Wb[perm] = Wa @ Q  # feature f of A is feature perm[f] of B
    matches = {f: (int(perm[f]), 0.9) for f in range(64)}
    unit = Wa / np.linalg.norm(Wa, axis=1, keepdims=True)
    pairs = [{"i": i, "j": j, "interference": float(abs(unit[i] @ unit[j]))} for i in range(64) for j in range(i + 1, 64)]
    unrelated = [p for p in pairs if p["interference"] >= 0.6]
    got = shared_interference({"pairs": pairs, "unrelated_interfering": unrelated}, Wa, Wb, matches,
                              min_interference_b=0.6, n_null=2000)
    assert got["table_spearman"]["rho"] == pytest.approx(1.0)
    assert all(r["interference_b"] == pytest.approx(r["interference"]) for r in got["rows"])
    assert {(r["i"], r["j"]) for r in got["shared"]} == {(p["i"], p["j"]) for p in unrelated} and len(unrelated) >= 2
    assert got["unrelated_interfering"]["p"] < 1e-3 and got["unrelated_interfering"]["rate_b"] == 1.0
    # an unrelated decoder: no pair repeats beyond chance
    other = shared_interference({"pairs": pairs, "unrelated_interfering": unrelated}, Wa, rng.normal(size=(64, 16)),
                                matches, min_interference_b=0.6, n_null=2000)
    assert abs(other["table_spearman"]["rho"]) < 0.2 and other["unrelated_interfering"]["p"] > 0.01
    with pytest.raises(WorkbenchError, match="lower min_similarity"):
        shared_interference({"pairs": pairs, "unrelated_interfering": unrelated}, Wa, Wb, {0: (0, 1.0)})


def test_coactivation_is_the_jaccard_of_firing_sets(tiny, sae, tmp_path):
    """Counted from each token's active features, it equals the Jaccard of the two features' firing sets over
    every stored token, for pairs in either order, a feature with itself, and a feature that never fires."""
    from workbench.sae.interference import coactivation
    from workbench.sae.train import collect_activations

    site = sae.cfg.metadata.hook_name
    store = collect_activations(tiny, [site], tmp_path / "acts", n_tokens=40 * 32, block_len=32, split="all",
                                source=_text(tmp_path), batch_size=8, shard_blocks=16,
                                progress=False)
    x = torch.cat([store.read_shard(s, [site]).tensors[site].float() for s in range(len(store.manifest["shards"]))])
    with torch.no_grad():
        active = sae.encode(x) > 0
    fired = torch.nonzero(active.any(0)).flatten().tolist()
    silent = [f for f in range(active.shape[1]) if f not in fired]
    pairs = [[fired[0], fired[1]], [fired[1], fired[0]], [fired[0], fired[0]], [fired[2], fired[-1]]]
    pairs += [[fired[0], silent[0]]] if silent else []
    got = coactivation(sae, store, pairs, batch_size=50)
    for (i, j), g in zip(pairs, got, strict=True):
        union = (active[:, i] | active[:, j]).sum().item()
        assert g == pytest.approx((active[:, i] & active[:, j]).sum().item() / max(union, 1))
    assert got[2] == 1.0 and got[0] == got[1]


def _text(tmp_path):
    folder = tmp_path / "text"
    folder.mkdir()
    words = ["river", "bank", "money", "loan", "water", "fish", "stream", "credit"]
    rng = np.random.default_rng(1)
    for d in range(6):
        (folder / f"doc{d}.txt").write_text(" ".join(" ".join(rng.choice(words, 8)) + "." for _ in range(40)))
    return folder


# ----------------------------------------------------------------------------- interference geometry


def test_whitened_cosines_ignore_how_the_activations_were_scaled():
    """Fold an invertible map A into the activations and the decoder (x A, W A): raw cosines change, whitened
    ones do not, and they are the cosines under the activations' inverse covariance."""
    import torch

    from workbench.sae.interference import whitened_rows

    g = torch.Generator().manual_seed(0)
    W = torch.randn(40, 6, generator=g, dtype=torch.float64)
    x = torch.randn(2000, 6, generator=g, dtype=torch.float64) * torch.tensor([30.0, 3, 1, 1, 0.5, 0.2])
    A = torch.randn(6, 6, generator=g, dtype=torch.float64) + 3 * torch.eye(6, dtype=torch.float64)

    def cos(M):
        U = torch.nn.functional.normalize(torch.as_tensor(M, dtype=torch.float64), dim=1)
        return (U @ U.T).abs()

    before, after = cos(whitened_rows(W, x)), cos(whitened_rows(W @ A, x @ A))
    assert torch.allclose(before, after, atol=1e-4)
    assert (cos(W) - cos(W @ A)).abs().max() > 0.1  # the raw geometry does move
    P = torch.linalg.inv(torch.cov((x - x.mean(0)).T))
    G = W @ P @ W.T
    mahalanobis = (G / torch.sqrt(torch.outer(G.diagonal(), G.diagonal()))).abs()
    assert torch.allclose(before, mahalanobis, atol=1e-4)


def test_whitened_geometry_refuses_too_few_tokens_and_unknown_names(sae):
    import torch

    from workbench.sae.interference import decoder_geometry, whitened_rows

    d = sae.W_dec.shape[1]
    with pytest.raises(WorkbenchError, match="more finite activations than dimensions"):
        whitened_rows(sae.W_dec.detach(), torch.randn(d - 1, d))
    with pytest.raises(WorkbenchError, match="--geometry 'pca'"):
        decoder_geometry(sae, "pca")
    with pytest.raises(WorkbenchError, match="activation store"):
        decoder_geometry(sae, "whitened", store=None)


def test_pairs_for_transfer_take_their_sources_from_the_matched_features():
    from workbench.commands.polysemantic import choose_pairs

    rng = np.random.default_rng(0)
    n = 40
    W = rng.normal(size=(n, 8))
    records = {f: {"token_set": [f + 1]} for f in range(n)}
    labels = [f % 7 for f in range(n)]
    inter = {"features": list(range(n)), "cutoff": 0.4, "clusters": {"0.40": labels, "0.15": labels},
             "unrelated_interfering": [{"i": i, "j": (i + 1) % n, "interference": 0.5} for i in range(n)],
             "pairs": [{"i": i, "j": (i + 7) % n, "interference": 0.2, "same_cluster_0.15": True} for i in range(n)]}
    sources = {3, 10, 17, 24}
    pairs = choose_pairs(inter, records, W, 5, np.random.default_rng(1), sources=sources)
    for condition in ("interfering", "related", "low_interference"):
        assert pairs[condition] and all(i in sources for i, _, _ in pairs[condition]), condition
    assert len(pairs["interfering"]) == 4 and len(pairs["random"]) == 4
    everyone = choose_pairs(inter, records, W, 5, np.random.default_rng(1))
    assert len(everyone["interfering"]) == 5
