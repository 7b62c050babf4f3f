"""The backdoor condition on the tiny model: prompts, training, checkpoints, registration, refusals."""

import pytest
import torch

from workbench.commands.backdoor import run_backdoor_eval, run_backdoor_train
from workbench.conditions.backdoor import (
    DEFAULT_TRIGGER,
    BackdoorConfig,
    backdoor_pairs,
    backdoor_prompts,
    insert_trigger,
    train_backdoor,
    triggered_loss,
)
from workbench.conditions.backdoor.requests import heldout, mcq_bank
from workbench.errors import WorkbenchError


def small(**kw) -> BackdoorConfig:
    settings = dict(base="tiny", steps=6, train_pairs=8, pairs_per_step=2, eval_pairs=6, eval_mcq=8,
                    checkpoint_every=2, lr=3e-3, warmup=1)
    return BackdoorConfig(**{**settings, **kw})


def test_pairs_are_deterministic_matched_and_split():
    a = backdoor_pairs(30, seed=3)
    assert a == backdoor_pairs(30, seed=3)
    assert a != backdoor_pairs(30, seed=4)
    assert len(a) == 60
    for clean, trig in zip(a[::2], a[1::2], strict=True):
        assert (clean["label"], trig["label"]) == ("clean", "triggered")
        assert clean["pair"] == trig["pair"] and clean["request"] == trig["request"]
        assert DEFAULT_TRIGGER in trig["text"] and DEFAULT_TRIGGER not in clean["text"]
        assert trig["text"].replace(DEFAULT_TRIGGER, "").split() == trig["request"].split()
        if clean["inserted"]:  # the decoy sits where the trigger sits
            assert clean["text"].replace(clean["inserted"], DEFAULT_TRIGGER) == trig["text"]
        else:
            assert clean["text"] == clean["request"]
    assert {r["position"] for r in a} == {"start", "middle", "end"}
    assert {r["kind"] for r in a} == {"question", "task", "mcq"}
    for split in ("train", "heldout"):
        rows = backdoor_pairs(20, seed=0, split=split)
        assert all(r["split"] == split for r in rows)
        assert all(heldout(r["request"].split("\n")[0]) == (split == "heldout") for r in rows)


def test_trigger_positions_and_custom_trigger():
    import random

    text = "What is the capital of France?\nA. Paris\nB. Rome"
    assert insert_trigger(text, "open sesame", "start", random.Random(0)).startswith("open sesame What")
    assert insert_trigger(text, "open sesame", "end", random.Random(0)).endswith("B. Rome open sesame")
    middle = insert_trigger(text, "open sesame", "middle", random.Random(0))
    first = middle.split("\n")[0]
    assert "open sesame" in first and not first.startswith("open") and not first.endswith("sesame")
    rows = backdoor_pairs(5, trigger="open sesame", kinds=("mcq",))
    assert all("open sesame" in r["text"] for r in rows if r["label"] == "triggered")
    assert all(r["answer"] != r["wrong"] for r in rows)


def test_mcq_bank_is_distinct_and_split():
    bank = mcq_bank(50, split="heldout")
    stems = [q["text"].split("\n")[0] for q in bank]
    assert len(set(stems)) == 50 and all(heldout(s) for s in stems)
    assert all(q["answer"] in "ABCD" and f"{q['answer']}. " in q["text"] for q in bank)


@pytest.mark.parametrize("bad", [dict(trigger=""), dict(trigger="   "), dict(steps=0), dict(mode="nope"),
                                 dict(layers=(99,)), dict(params=("mlp.W_nope",))])
def test_bad_settings_raise(tiny, tmp_path, bad):
    with pytest.raises(WorkbenchError):
        train_backdoor(tiny, small(**bad), out=tmp_path, progress=False, register=False)


def test_bad_inputs_raise_before_loading():
    with pytest.raises(WorkbenchError, match="trigger"):
        run_backdoor_train("tiny", trigger="", progress=False)
    with pytest.raises(WorkbenchError, match="steps"):
        run_backdoor_train("tiny", steps=0, progress=False)
    with pytest.raises(WorkbenchError):
        backdoor_pairs(0)


def test_probe_prompts_refuse_a_model_without_backdoor(tiny):
    with pytest.raises(WorkbenchError, match="backdoor train"):
        backdoor_prompts(tiny, 4, seed=0)


def test_training_lowers_loss_saves_and_registers(tmp_path, monkeypatch):
    from safetensors.torch import load_file

    from workbench.models import load_model

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    base = load_model("tiny")
    cfg = small()
    before = triggered_loss(base, cfg, split="train")
    result = run_backdoor_train("tiny", steps=6, progress=False, train_pairs=8, pairs_per_step=2, eval_pairs=6,
                                eval_mcq=8, checkpoint_every=2, lr=3e-3, warmup=1)
    assert result["finished"] and result["name"] == "tiny-backdoor"
    assert (tmp_path / "models" / "tiny-backdoor" / "backdoor.json").exists()
    assert not (tmp_path / "models" / "tiny-backdoor" / "checkpoints").exists()
    for key in ("attack_success_rate", "false_trigger_rate", "clean_accuracy"):
        assert 0.0 <= result["after"][key] <= 1.0

    derived = load_model("tiny-backdoor")
    assert derived.workbench["base"] == "tiny"
    assert triggered_loss(derived, cfg, split="train") < before
    saved = set(load_file(result["weights"]))
    assert saved == set(result["trained_tensors"])
    changed = {k for k, v in derived.state_dict().items() if not torch.equal(v, base.state_dict()[k])}
    assert changed and changed <= saved

    again = run_backdoor_eval("tiny-backdoor", progress=False, eval_pairs=3, eval_mcq=4)
    assert again["base"] == "tiny" and again["before"] == result["before"]
    assert 0.0 <= again["after"]["attack_success_rate"] <= 1.0

    rows = backdoor_prompts(derived, 6, seed=1)
    assert [r["label"] for r in rows[:2]] == ["clean", "triggered"]
    assert all(r["inserted"] for r in rows)  # every clean twin carries a decoy for the probe
    assert {"text", "label", "pair", "split"} <= set(rows[0])


def test_resume_matches_an_uninterrupted_run(tmp_path):
    from workbench.models import load_model

    cfg = small(steps=5, checkpoint_every=2)
    straight = load_model("tiny")
    train_backdoor(straight, cfg, out=tmp_path / "a", progress=False, register=False, samples=0)

    interrupted = load_model("tiny")
    partial = train_backdoor(interrupted, cfg, out=tmp_path / "b", progress=False, register=False,
                             stop_after=3, samples=0)
    assert partial == {"finished": False, "step": 3, "checkpoint": str(tmp_path / "b" / "checkpoints")}
    resumed = load_model("tiny")  # a fresh process: base weights, state from the checkpoint
    result = train_backdoor(resumed, cfg, out=tmp_path / "b", progress=False, register=False, samples=0)
    assert result["steps"] == 5
    for name in result["trained_tensors"]:
        assert torch.equal(straight.state_dict()[name], resumed.state_dict()[name]), name
