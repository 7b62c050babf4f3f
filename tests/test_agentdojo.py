"""AgentDojo's environments as a condition: matched twins, exact spans, balanced seeded samples, one-line errors.

Needs AgentDojo's data (``make setup``: ``pip install --no-deps agentdojo==0.1.35``); skipped without it.
"""

import re

import pytest

from workbench.conditions import CONDITIONS, Condition, get_condition
from workbench.conditions import agentdojo as ad
from workbench.errors import WorkbenchError

try:
    ad.agentdojo_root()
except WorkbenchError:
    pytest.skip("AgentDojo's data is not installed (make setup)", allow_module_level=True)

SUITES = ("banking", "slack", "travel", "workspace")
CHAT_MARKUP = re.compile(r"<\|[^|>]*\|>|\[/?INST\]|<s>|</s>|<start_of_turn>|<end_of_turn>|<bos>|<eos>")


@pytest.fixture(scope="module")
def everything():
    return ad.agentdojo_records()


def _pairs(records):
    return list(zip(records[::2], records[1::2], strict=True))


def test_counts_of_what_agentdojo_brings(everything):
    vectors = {s: len(ad.suite_vectors(s)) for s in SUITES}
    tasks = {s: len(ad.injection_goals(s)) for s in SUITES}
    assert ad.suite_names() == SUITES
    assert vectors == {"banking": 4, "slack": 6, "travel": 13, "workspace": 16}
    assert tasks == {"banking": 9, "slack": 5, "travel": 7, "workspace": 6} and sum(tasks.values()) == 27
    assert set(ad.attack_templates()) == {
        "direct", "ignore_previous", "system_message", "injecagent", "important_instructions",
        "important_instructions_no_user_name", "important_instructions_no_model_name",
        "important_instructions_no_names", "important_instructions_wrong_model_name",
        "important_instructions_wrong_user_name"}  # manual (asks a human) and tool_knowledge ({tools}) skipped
    combos = ad.combinations()
    assert len(combos) == len(set(combos)) == 10 * sum(vectors[s] * tasks[s] for s in SUITES) == 2530
    assert len(everything) == 2 * len(combos)
    assert {(r["suite"], r["vector"], r["injection_task"], r["attack"]) for r in everything} == set(combos)


def test_goals_are_the_evaluated_constants_of_the_task_classes():
    goals = ad.injection_goals("banking")
    assert goals["injection_task_0"].startswith("Send a transaction to US133000000121212121212 that includes")
    assert goals["injection_task_8"].startswith("Send a transaction to US133000000121212121212 ")  # a public constant
    assert "{" not in goals["injection_task_7"] and goals["injection_task_7"].endswith("new_password.")
    assert "{hotel_name}" in ad.injection_goals("travel")["injection_task_5"]  # a plain string keeps its braces
    attacks = ad.attack_templates()
    assert attacks["important_instructions"]["user"] == "Emma Johnson"
    assert attacks["important_instructions_no_names"]["user"] == "the user"
    assert attacks["important_instructions_wrong_user_name"]["user"] == "Mark Smith"


def test_records_are_deterministic_and_labelled_in_pairs():
    a = ad.agentdojo_records(n_pairs=24, seed=5)
    assert a == ad.agentdojo_records(n_pairs=24, seed=5)
    assert a != ad.agentdojo_records(n_pairs=24, seed=6)
    assert [r["label"] for r in a] == ["clean", "injected"] * 24
    assert [r["pair"] for r in a] == [i // 2 for i in range(48)]
    keys = {"source", "suite", "attack", "injection_task", "vector", "document_kind", "position",
            "inserted_chars", "pair", "span", "text", "label"}
    assert all(keys <= set(r) and r["source"] == "agentdojo" for r in a)


def test_twins_differ_only_at_the_vector(everything):
    for clean, injected in _pairs(everything):
        assert {k: v for k, v in clean.items() if k not in ("text", "label", "span", "inserted_chars", "inserted", "inserted_span")} \
            == {k: v for k, v in injected.items() if k not in ("text", "label", "span", "inserted_chars", "inserted", "inserted_span")}
        at = clean["position"]
        assert clean["text"][:at] == injected["text"][:at]
        assert clean["text"][at + clean["inserted_chars"]:] == injected["text"][at + injected["inserted_chars"]:]
        shown = injected["text"][at:at + injected["inserted_chars"]]
        assert re.sub(r"\n +", "\n", shown) == re.sub(r"\n +", "\n", injected["inserted"])  # verbatim, indented


def test_goal_text_is_in_injected_twins_only(everything):
    for clean, injected in _pairs(everything):
        goal = injected["goal"]
        assert goal in injected["text"][injected["position"]:injected["position"] + injected["inserted_chars"]]
        assert goal not in clean["text"]


def test_span_slices_exactly_the_tool_output(everything):
    for r in everything:
        a, b = r["span"]
        assert 0 <= a < b <= len(r["text"])
        assert r["text"][:a].endswith("\n\n<tool_output>\n") and r["text"][b:] == "\n</tool_output>"
        assert r["text"][:a - len("\n\n<tool_output>\n")] == r["user_prompt"]
        assert a <= r["position"] <= r["position"] + r["inserted_chars"] <= b
        assert r["inserted_span"] == [r["position"], r["position"] + r["inserted_chars"]]
        assert r["text"].count("<tool_output>") == r["text"].count("</tool_output>") == 1


def test_text_is_plain(everything):
    for r in everything:
        assert not CHAT_MARKUP.search(r["text"]), r["text"]
        assert "\x00" not in r["text"] and not re.search(r"\{(injection|prompt_injection|calendar|email|drive)\w*\}",
                                                         r["text"])
        assert "  " not in r["user_prompt"] and r["user_prompt"] == r["user_prompt"].strip()


def test_every_suite_and_kind_and_the_default_clean_values(everything):
    assert {r["suite"] for r in everything} == set(SUITES)
    kinds = {r["document_kind"] for r in everything}
    assert kinds <= set(ad.KINDS) and {"email", "calendar event", "file", "transaction", "web page", "review"} <= kinds
    bill = next(r for r in everything if r["vector"] == "injection_bill_text" and r["label"] == "clean")
    assert "Car Rental\t\t98.70\n" in bill["text"] and "\\t" not in bill["text"]  # AgentDojo's escapes decoded
    review = next(r for r in everything if r["vector"] == "injection_hotels_0" and r["label"] == "clean")
    assert "name: Le Marais Boutique" in review["text"] and "- Awesome hotel" in review["text"]
    assert "Le Marais Boutique" in review["user_prompt"]  # the user task that reads this hotel's reviews


def test_small_samples_are_balanced_across_suites_and_attacks():
    records = ad.agentdojo_records(n_pairs=80, seed=1)
    injected = records[1::2]
    per_suite = [sum(r["suite"] == s for r in injected) for s in SUITES]
    per_attack = [sum(r["attack"] == a for r in injected) for a in ad.attack_templates()]
    assert per_suite == [20] * 4 and per_attack == [8] * 10
    assert len({(r["suite"], r["attack"]) for r in injected}) == 40
    one = ad.agentdojo_records(suites="slack", attacks=["direct", "injecagent"], n_pairs=7)
    assert {r["suite"] for r in one} == {"slack"} and {r["attack"] for r in one} == {"direct", "injecagent"}


def test_bad_input_is_one_line():
    with pytest.raises(WorkbenchError, match="unknown AgentDojo suite 'bankin': use some of banking, slack, travel, workspace"):
        ad.agentdojo_records(suites=["bankin"])
    with pytest.raises(WorkbenchError, match="unknown AgentDojo attack 'dan': use some of direct, ignore_previous") as e:
        ad.agentdojo_records(attacks="dan")
    assert "\n" not in str(e.value)
    with pytest.raises(WorkbenchError, match="2530 distinct"):
        ad.agentdojo_records(n_pairs=2531)
    with pytest.raises(WorkbenchError, match="positive integer"):
        ad.agentdojo_records(n_pairs=0)


def test_not_installed_is_one_line(monkeypatch):
    monkeypatch.setattr(ad, "package_root", lambda name, marker: None)
    with pytest.raises(WorkbenchError, match=re.escape("pip install --no-deps agentdojo==0.1.35")) as e:
        ad.agentdojo_records(n_pairs=2)
    assert "\n" not in str(e.value)


def test_registered_condition(tiny):
    condition = get_condition("agentdojo")
    assert isinstance(condition, Condition) and CONDITIONS["agentdojo"] is condition
    assert condition.adversarial_label == "injected" and condition.kinds == ad.KINDS
    records = condition.prompts(tiny, 6, seed=2)
    assert records == condition.prompts(tiny, 6, seed=2) == ad.agentdojo_records(n_pairs=6, seed=2)
    assert [r["label"] for r in records] == ["clean", condition.adversarial_label] * 6
    assert {r["document_kind"] for r in records} <= set(condition.kinds)
