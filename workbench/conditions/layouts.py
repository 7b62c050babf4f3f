"""Where the user's request sits around the document: before it, after it, or on both sides.

Almost every training turn put the request first: AgentDojo's and the documentation near-misses' always,
the generator's 85% of the time. People also paste the document first and ask after it, or ask, paste and
repeat the request. Measured on held-out generator draws (stop 41), the detector trained that way, reading
everything after the first blank line, fell from AUC 0.82 to 0.65 when the same turns put the request after the
document, and its threshold flagged 24% of clean turns instead of 5%.

``relaid`` rewrites a record in another layout (the document, its delimiters and the insertion untouched, every
character span moved with them); ``mixed_layouts`` gives each clean/injected pair one layout drawn from its seed,
both twins the same, so pairs stay matched. A record whose request cannot be told from its document (no
``span``, or no request before the first blank line ahead of the document, as in some of garak's probes) keeps
its text.
"""

from __future__ import annotations

import random

from workbench.errors import WorkbenchError

LAYOUTS = ("request first", "document first", "request on both sides")
SPANS = ("span", "inserted_span", "insertion_span")  # character ranges of the text that move with the document
SHARES = (0.5, 0.25, 0.25)  # how often mixed_layouts draws each layout: most people ask first


def _parts(record: dict) -> tuple[str, str, int] | None:
    """(request, document block: the document with its delimiters, where the block starts), or None when they cannot be told apart. The
    request is the record's ``request`` (the generator's, first or last, after one or two newlines), else what
    stands before the first blank line ahead of the document (AgentDojo's, the documentation near-misses')."""
    text, span, request = record["text"], record.get("span"), record.get("request")
    if not span:
        return None
    if request:
        if text.startswith(request):
            start = len(request) + (2 if text[len(request):].startswith("\n\n") else 1)
            return request, text[start:], start
        if text.endswith(request):
            rest = text[: len(text) - len(request)]
            return request, rest[:-2] if rest.endswith("\n\n") else rest[:-1], 0
        return None
    head = text[: int(span[0])]
    cut = head.find("\n\n")
    if cut <= 0 or not head[:cut].strip():
        return None
    return head[:cut], text[cut + 2:], cut + 2


def relaid(record: dict, layout: str) -> dict:
    """``record`` with its request placed by ``layout`` (one of ``LAYOUTS``) and its ``layout`` recorded."""
    if layout not in LAYOUTS:
        raise WorkbenchError(f"unknown layout {layout!r}: use one of {', '.join(LAYOUTS)}")
    parts = _parts(record)
    if parts is None:
        return dict(record)
    request, block, old_start = parts
    if layout == "request first":
        text, start = request + "\n\n" + block, len(request) + 2
    elif layout == "document first":
        text, start = block + "\n\n" + request, 0
    else:
        text, start = request + "\n\n" + block + "\n\n" + request, len(request) + 2
    shift = start - old_start
    moved = {k: [int(record[k][0]) + shift, int(record[k][1]) + shift] for k in SPANS if record.get(k)}
    return {**record, **moved, "text": text, "layout": layout}


def mixed_layouts(records: list[dict], seed: int = 0) -> list[dict]:
    """Each pair (records sharing ``source`` and ``pair``; a record without ``pair`` is its own) relaid in one
    layout drawn from ``seed`` and the pair's key, so the draw does not depend on the records' order."""
    out = []
    for i, r in enumerate(records):
        key = f"{seed}:{r.get('source')}:{r['pair'] if r.get('pair') is not None else f'row {i}'}"
        layout = random.Random(key).choices(LAYOUTS, weights=SHARES)[0]
        out.append(relaid(r, layout))
    return out
