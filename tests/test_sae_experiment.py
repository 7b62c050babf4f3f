"""The polysemantic study job end to end on the tiny model, through the runner: SAE, map, four loci, sharing.

The partner is the tiny model itself, so its analysis SAE is the same SAE (reused by name): every
feature matches itself, B's interference equals A's, and the shared pairs are A's unrelated-yet-
interfering pairs above the threshold. A sanity check of the whole cross-model path that could fail.
"""

import json

import numpy as np
import pytest
import yaml


@pytest.fixture(scope="module")
def text_source(tmp_path_factory):
    folder = tmp_path_factory.mktemp("text")
    words = ["river", "bank", "money", "loan", "water", "fish", "stream", "credit", "cash", "boat", "the", "a"]
    rng = np.random.default_rng(0)
    for d in range(60):
        (folder / f"doc{d}.txt").write_text(" ".join(" ".join(rng.choice(words, 8)) + "." for _ in range(30)))
    return folder


def test_polysemantic_job_with_a_partner(tmp_path, monkeypatch, text_source):
    from workbench.commands.study import results_table, run_study, write_results

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    site = "blocks.1.hook_resid_post"
    config = {
        "name": "poly", "seed": 0, "job": "workbench.commands.study_jobs:polysemantic",
        "report": "workbench.commands.study_jobs:polysemantic_report", "grid": {"model": ["tiny"]},
        "fixed": {
            "source": str(text_source), "train_tokens": 20000, "eval_tokens": 256, "analysis_sae": 0,
            "collect": {"sites": [site], "n_tokens": 64 * 64, "block_len": 64, "budget_s": None},
            "saes": [{"site": site, "architecture": "topk", "d_sae": 64, "k": 4, "batch_size": 256, "lr": 0.002}],
            "transfer": ["tiny"],
            "shared": {"min_similarity": 0.6, "min_interference_b": 0.29},
            "interference": {"k": 8, "min_interference": 0.3, "cutoff": 0.4},
            "interventions": {"n_pairs": 3, "topk": 10, "prompts": ["the river", "money and"], "n_bootstrap": 50,
                              "scales": {"feature": [1.0], "token": [1.0], "neuron": [4.0], "prompt": [1.0]}},
        },
    }
    path = tmp_path / "poly.yaml"
    path.write_text(yaml.safe_dump(config))
    outcome = run_study(path, progress=False)
    assert not outcome["failed"], outcome["failed"]
    out = write_results(outcome, tmp_path / "results")
    row = results_table(outcome)[0]
    assert row["sae"].startswith("study-tiny-0-1-topk-64-") and 0 < row["l0"] <= 4  # + a key of its settings
    folder = out / "tiny"
    record = json.loads((folder / "results.json").read_text())
    shared = record["transfer"]["tiny"]["shared"]
    # every feature matches itself, but features with identical descriptions only once
    assert 0.9 * record["interference"]["n_described"] <= shared["n_matched"] <= record["interference"]["n_described"]
    assert shared["table_spearman"]["rho"] > 0.99  # float32 scan vs float64 recomputation: near ties may swap
    n_unrel = record["interference"]["n_unrelated_interfering"]
    # features whose descriptions are identical may match each other's twin: allow a few
    matched_unrelated = (folder / "shared-tiny-pairs.csv").read_text().splitlines()[1:]
    assert len(matched_unrelated) >= len(shared["shared"]) >= 0.9 * len(matched_unrelated) >= 0.7 * min(n_unrel, 200)
    same = [r["i_b"] == r["i"] and r["interference_b"] == pytest.approx(r["interference"], abs=1e-5)
            for r in shared["shared"]]
    assert sum(same) >= 0.95 * len(same) > 0
    trials = (folder / "trials.csv").read_text().splitlines()
    assert trials[0].startswith("condition,locus") and any(line.startswith("shared,") for line in trials[1:])
    stats = (folder / "stats.csv").read_text()
    assert "shared," in stats and "interfering," in stats
    assert (folder / "shared-tiny.png").exists() and (folder / "figure.png").exists()
    assert "shared" in (folder / "transfer-tiny-stats.csv").read_text()
    # the feature locus replayed on the partner: here the partner is the model itself and every feature its
    # own match, so a pair steered along its matched feature must move the next token exactly as at home
    import csv

    from workbench.commands.polysemantic import METRICS

    home = {(r["condition"], r["scale"], r["source"], r["target"], r["prompt"]): r
            for r in csv.DictReader((folder / "trials.csv").read_text().splitlines()) if r["locus"] == "feature"}
    away = [r for r in csv.DictReader((folder / "transfer-tiny-trials.csv").read_text().splitlines()) if r["locus"] == "feature"]
    assert {r["condition"] for r in away} >= {"interfering", "random"}
    def key(r):
        return r["condition"], r["scale"], r["source"], r["target"], r["prompt"]

    same_tokens = [r for r in away if r["condition"] != "random" and r["target_feature"] == r["source"]
                   and r["target_tokens"] == r["source_tokens"] and key(r) in home]  # a pair tested at home too
    assert any(r["condition"] == "interfering" for r in same_tokens)
    for r in same_tokens:
        h = home[key(r)]
        for m in METRICS:
            assert float(r[m]) == pytest.approx(float(h[m]), rel=1e-4, abs=1e-6), (m, r)
    # the transfer pairs' sources are matched in the partner, so every pair is tested at both loci
    rows = list(csv.DictReader((folder / "transfer-tiny-trials.csv").read_text().splitlines()))
    at_prompt = {(r["condition"], r["source"], r["target"]) for r in rows
                 if r["locus"] == "prompt" and r["condition"] != "random"}
    assert at_prompt == {(r["condition"], r["source"], r["target"]) for r in away if r["condition"] != "random"}


def test_a_partner_sees_the_study_config_not_the_source_models_overrides(monkeypatch):
    """Each model's entry under ``models`` applies to that model only: a partner's view is laid over the study's
    top level (a Gemma-only interference geometry once leaked into its SmolLM2 partner)."""
    import workbench.commands.polysemantic as poly

    class Seen(Exception):
        pass

    seen = []

    def prepare(cfg, model, only_analysis=False):
        seen.append(cfg)
        if only_analysis:
            raise Seen
        return {"interference": {"features": [], "clusters": {"0.40": [], "0.15": []}, "cutoff": 0.4,
                                 "unrelated_interfering": [], "pairs": []}, "records": {}, "W": np.zeros((1, 1)),
                "sae": None, "embeddings": np.zeros((0, 4))}

    monkeypatch.setattr(poly, "prepare_model", prepare)
    monkeypatch.setattr("workbench.models.load_model", lambda name, device="cpu": name)
    top = {"seed": 0, "model": "a", "interference": {"k": 8, "geometry": "raw"},
           "interventions": {"n_pairs": 2}, "collect": {"n_tokens": 64},
           "models": {"a": {"interference": {"k": 8, "geometry": "whitened"}, "transfer": ["b"]},
                      "b": {"collect": {"sites": ["s"]}}}}
    with pytest.raises(Seen):
        poly.run_experiment(top)
    own, partner = seen
    assert own["model"] == "a" and own["interference"]["geometry"] == "whitened"
    assert partner["model"] == "b" and partner["interference"]["geometry"] == "raw"
    assert "transfer" not in partner and partner["collect"] == {"n_tokens": 64, "sites": ["s"]}
