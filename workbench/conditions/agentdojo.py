"""AgentDojo's environments as matched clean / indirect-prompt-injection prompts.

AgentDojo (Debenedetti et al., 2024; MIT licence) ships four tool environments (banking, slack, travel,
workspace) whose data hold named injection vectors (``{injection_*}`` placeholders in an email body, a
file, a review, a web page, a transaction subject, ...), attacker goals (its injection tasks), attack
templates and user tasks. We read those as *data*: the YAML with a safe loader and the Python files with
``ast`` (constants, f-strings over constants, nothing executed), because importing ``agentdojo`` pulls its
LLM clients. Install the data with ``pip install --no-deps agentdojo==0.1.35`` (``make setup`` does).

A pair is (suite, vector, injection task, attack): the object that holds the vector (the email, the file,
the hotel with its reviews, ...) rendered as a plain YAML-like tool result, after one of the suite's user
requests. The clean twin carries the vector's default text, the injected twin the attack template filled
with the goal, so the twins differ only at the vector (``position``, ``inserted_chars``). Unlike the
synthetic ``injection`` condition, the twins are not length-matched: AgentDojo's defaults are often empty.
Attack text is inserted verbatim (AgentDojo's own round-trip through a quoted YAML scalar folds newlines).
"""

from __future__ import annotations

import ast
import contextlib
import logging
import math
import random
import re
import string
from fractions import Fraction
from functools import lru_cache
from pathlib import Path

import yaml

from workbench.conditions.pysource import NotConstant, bind, constant, installed_version, package_root, parse
from workbench.errors import WorkbenchError

log = logging.getLogger(__name__)

VERSION = "0.1.35"  # the release whose files this reader was written against
INSTALL = f"pip install --no-deps agentdojo=={VERSION} (or `make setup`)"
BENCHMARK = "v1"  # default_suites/v1: 27 injection tasks; later versions patch a few tasks
ATTACK_FILES = ("attacks/baseline_attacks.py", "attacks/important_instructions_attacks.py")
VICTIM_MODEL_NAME = "the assistant"  # AgentDojo names the victim from its pipeline (e.g. "GPT-4"); ours has none
TEMPLATE_FIELDS = {"goal", "user", "model", "task"}  # what FixedJailbreakAttack fills; others need a pipeline

# collection key in an environment -> (document kind, the tools that return its items)
SITES = {
    "initial_emails": ("email", ("search_emails", "get_received_emails", "get_unread_emails")),
    "initial_events": ("calendar event", ("search_calendar_events", "get_day_calendar_events")),
    "initial_files": ("file", ("search_files_by_filename", "search_files", "get_file_by_id", "list_files")),
    "files": ("file", ("read_file",)),
    "transactions": ("transaction", ("get_most_recent_transactions",)),
    "scheduled_transactions": ("transaction", ("get_scheduled_transactions",)),
    "web_content": ("web page", ("get_webpage",)),
    "channels": ("channel list", ("get_channels",)),
    "channel_inbox": ("message", ("read_channel_messages",)),
    "user_inbox": ("message", ("read_inbox",)),
    "hotel_list": ("review", ("get_rating_reviews_for_hotels",)),
    "restaurant_list": ("review", ("get_rating_reviews_for_restaurants",)),
    "company_list": ("review", ("get_rating_reviews_for_car_rental",)),
}
KINDS = tuple(dict.fromkeys(kind for kind, _ in SITES.values()))  # "message": no vector in 0.1.35's slack inboxes
NAME_FIELDS = {"files": "file_path", "web_content": "url"}  # a named string (file, page) renders as name + content
_SENTINEL = "\x00"


def agentdojo_root() -> Path:
    """The installed ``agentdojo`` folder, found without running its ``__init__`` (which imports LLM clients)."""
    root = package_root("agentdojo", "data/suites")
    if root is None:
        raise WorkbenchError(f"AgentDojo's data is not installed: {INSTALL}")
    return root


def agentdojo_version() -> str | None:
    return installed_version("agentdojo")


def suite_names() -> tuple[str, ...]:
    """The suites with an environment, injection vectors and injection tasks."""
    root = agentdojo_root()
    return tuple(sorted(p.name for p in (root / "data" / "suites").iterdir()
                        if (p / "environment.yaml").is_file() and (p / "injection_vectors.yaml").is_file()
                        and (root / "default_suites" / BENCHMARK / p.name / "injection_tasks.py").is_file()))


# --- YAML --------------------------------------------------------------------------------------------------


class _IncludeLoader(yaml.SafeLoader):
    """SafeLoader plus AgentDojo's ``!include path`` tag (the workspace suite splits its environment)."""


def _construct_include(loader: _IncludeLoader, node: yaml.Node):
    base = Path(getattr(loader, "name", ".")).parent
    path = (base / str(loader.construct_scalar(node))).resolve()
    return _load_yaml(path)


_IncludeLoader.add_constructor("!include", _construct_include)


def _load_yaml(path: Path):
    with path.open(encoding="utf-8") as f:
        loader = _IncludeLoader(f)
        loader.name = str(path)
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()


def _unescape(text: str) -> str:
    """Defaults are spliced into a double-quoted YAML scalar by AgentDojo, so their ``\\n``/``\\t`` are escapes."""
    return re.sub(r"\\([nt\\\"])", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), text)


# --- Python sources as data (ast) ---------------------------------------------------------------------------


@lru_cache(maxsize=64)
def _module_scope(path: Path) -> dict:
    """Module-level constants, with constants imported from other ``agentdojo`` modules."""
    root, scope = agentdojo_root(), {}
    for stmt in parse(path).body:
        if isinstance(stmt, ast.ImportFrom) and (stmt.module or "").startswith("agentdojo."):
            rel = Path(*stmt.module.split(".")[1:])
            source = next((p for p in (root / rel.with_suffix(".py"), root / rel / "__init__.py") if p.is_file()), None)
            if source is not None and source != path:
                names = _module_scope(source)
                scope.update({a.asname or a.name: names[a.name] for a in stmt.names if a.name in names})
    bind(parse(path).body, scope, {})
    return scope


def _classes(path: Path) -> list[tuple[ast.ClassDef, dict]]:
    """Each class of a module with its constant class attributes."""
    module = _module_scope(path)
    out = []
    for stmt in parse(path).body:
        if isinstance(stmt, ast.ClassDef):
            attrs: dict = {}
            bind(stmt.body, attrs, module)
            out.append((stmt, attrs))
    return out


def _task_id(class_name: str) -> str:
    """``InjectionTask3`` -> ``injection_task_3``, AgentDojo's own ids."""
    return re.sub(r"(?<!^)(?=[A-Z])|(?<=[a-z])(?=\d)", "_", class_name).lower()


_PROSE_ATTRS = {"PROMPT", "COMMENT", "GROUND_TRUTH_OUTPUT", "GOAL"}  # free text, not names of things


def _prose(text: str) -> str:
    return " ".join(text.split())  # PROMPTs use backslash continuations full of indentation


@lru_cache(maxsize=8)
def injection_goals(suite: str) -> dict[str, str]:
    """``injection_task_N`` -> GOAL for one suite (tasks whose GOAL is not a constant are skipped)."""
    path = agentdojo_root() / "default_suites" / BENCHMARK / suite / "injection_tasks.py"
    return {_task_id(cls.name): _prose(attrs["GOAL"]) for cls, attrs in _classes(path)
            if isinstance(attrs.get("GOAL"), str)}


@lru_cache(maxsize=8)
def user_tasks(suite: str) -> dict[str, dict]:
    """``user_task_N`` -> its PROMPT, the tools its ground truth calls and the strings it names."""
    path = agentdojo_root() / "default_suites" / BENCHMARK / suite / "user_tasks.py"
    tasks = {}
    for cls, attrs in _classes(path):
        if not isinstance(attrs.get("PROMPT"), str):
            continue
        tools = {kw.value.value for node in ast.walk(cls) if isinstance(node, ast.Call)
                 for kw in node.keywords if kw.arg == "function" and isinstance(kw.value, ast.Constant)}
        names = {v for k, v in attrs.items() if isinstance(v, str) and k not in _PROSE_ATTRS}
        names |= {v.value for node in ast.walk(cls) if isinstance(node, ast.Dict | ast.List)  # argument values
                  for v in (node.values if isinstance(node, ast.Dict) else node.elts)
                  if isinstance(v, ast.Constant) and isinstance(v.value, str)}
        names |= {m.group(1) or m.group(2)  # 'quoted things', file names, addresses and URLs in the prompt
                  for m in re.finditer(r"(?<!\w)'([^'\s][^']{3,60}[^'\s])'(?!\w)|(\b\S+[.@]\S*\w)", attrs["PROMPT"])}
        names = {n for n in names if len(n) >= 5 and "\n" not in n}
        tasks[_task_id(cls.name)] = {"prompt": _prose(attrs["PROMPT"]), "tools": tools, "names": names}
    return tasks


_VICTIM, _WRONG = object(), object()  # the victim model's name; a wrong model name (AgentDojo's choice)


def _name_value(node: ast.AST, scope: dict):
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return {"get_model_name_from_pipeline": _VICTIM, "get_wrong_model_name_from_pipeline": _WRONG}.get(node.func.id)
    try:
        return constant(node, scope)
    except NotConstant:
        return None


@lru_cache(maxsize=1)
def attack_templates() -> dict[str, dict]:
    """Attack name -> {template, user, model}: the fixed-template attacks of AgentDojo, read with ``ast``.

    An attack's template is the string its ``__init__`` hands to ``super().__init__`` (a literal or
    ``self._JB_STRING``), inherited when it hands none; ``user_name``/``model_name`` come from class
    attributes and ``self.x = ...`` in ``__init__``. Attacks whose template needs more than goal, user,
    model and task (``tool_knowledge``'s ground-truth tool calls) or asks a human (``manual``) are skipped.
    """
    root = agentdojo_root()
    base = _module_scope(root / "attacks" / "base_attacks.py")
    defaults = {"template": None, "user": base.get("DEFAULT_USER_NAME", "the user"),
                "model": base.get("DEFAULT_MODEL_NAME", "the AI language model")}
    resolved: dict[str, dict] = {}  # class name -> what it passes on to subclasses
    attacks: dict[str, dict] = {}
    for file in ATTACK_FILES:
        module = _module_scope(root / file)
        for cls, attrs in _classes(root / file):
            parent = next((resolved[b.id] for b in cls.bases if isinstance(b, ast.Name) and b.id in resolved), None)
            info = dict(parent or defaults, attrs={**(parent or {}).get("attrs", {}), **attrs})
            info["user"] = attrs.get("user_name", info["user"])
            info["model"] = attrs.get("model_name", info["model"])
            init = next((s for s in cls.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None)
            for stmt in ast.walk(init) if init else ():
                if (isinstance(stmt, ast.Call) and isinstance(stmt.func, ast.Attribute) and stmt.func.attr == "__init__"
                        and stmt.args):
                    first = stmt.args[0]
                    if isinstance(first, ast.Attribute) and isinstance(first.value, ast.Name) and first.value.id == "self":
                        info["template"] = ("attr", first.attr)
                    elif isinstance(first, ast.Constant | ast.JoinedStr):
                        info["template"] = ("text", _name_value(first, module))
                elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                    t = stmt.targets[0]
                    if isinstance(t, ast.Attribute) and t.attr in ("user_name", "model_name"):
                        info["user" if t.attr == "user_name" else "model"] = _name_value(stmt.value, module)
            resolved[cls.name] = info
            name = attrs.get("name")
            if not isinstance(name, str):
                continue
            kind, value = info["template"] or (None, None)
            template = info["attrs"].get(value) if kind == "attr" else value
            fields = {f for _, f, _, _ in string.Formatter().parse(template)} - {None} if isinstance(template, str) else None
            if fields is None or not fields <= TEMPLATE_FIELDS or "goal" not in fields or None in (info["user"], info["model"]):
                continue
            attacks[name] = {"template": template, "user": info["user"], "model": info["model"]}
    return attacks


@lru_cache(maxsize=1)
def _model_names() -> list[str]:
    """The prose model names of ``agentdojo/models.py`` (``MODEL_NAMES``, a dict literal), in order."""
    for stmt in parse(agentdojo_root() / "models.py").body:
        if isinstance(stmt, ast.Assign) and getattr(stmt.targets[0], "id", None) == "MODEL_NAMES":
            with contextlib.suppress(ValueError, SyntaxError):
                names = ast.literal_eval(stmt.value)
                return list(names.values()) if isinstance(names, dict) else []
    return []


def _fill(attack: dict, goal: str, task_prompt: str) -> str:
    model = attack["model"]
    if model is _VICTIM:
        model = VICTIM_MODEL_NAME
    elif model is _WRONG:  # AgentDojo: random.Random(0).choice over the other names of MODEL_NAMES
        others = [n for n in _model_names() if n != VICTIM_MODEL_NAME]
        model = random.Random(0).choice(others) if others else "another AI model"
    return attack["template"].format(goal=goal, user=attack["user"], model=model, task=task_prompt)


# --- environments -------------------------------------------------------------------------------------------


def _paths(obj, path=()):
    """(path, string) for every string in a loaded environment, in document order."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, (*path, i))
    elif isinstance(obj, str):
        yield path, obj


def _get(obj, path):
    for key in path:
        obj = obj[key]
    return obj


def _fill_placeholders(obj, values: dict):
    """A copy of ``obj`` with every ``{vector}`` in its strings replaced by ``values[vector]``."""
    if isinstance(obj, dict):
        return {k: _fill_placeholders(v, values) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_fill_placeholders(v, values) for v in obj]
    if isinstance(obj, str):
        return re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), m.group(0)), obj)
    return obj


class _Renderer:
    """Plain YAML-like text, strings verbatim (continuation lines indented): the tool result a model reads.

    Strings are never quoted or escaped, so the twins differ only inside the vector's value.
    """

    def __init__(self):
        self.indent = None  # the continuation indent of the string holding the sentinel

    def scalar(self, value, cont: str) -> str:
        if isinstance(value, str):
            if _SENTINEL in value:
                self.indent = cont
            return indent_lines(value, cont) if value else '""'
        if isinstance(value, bool):
            return "true" if value else "false"
        if value is None:
            return "null"
        if isinstance(value, dict | list):
            return "{}" if isinstance(value, dict) else "[]"
        return str(value)

    def mapping(self, obj: dict, ind: str) -> str:
        out = []
        for key, value in obj.items():
            if isinstance(value, dict) and value:
                out.append(f"{ind}{key}:\n{self.mapping(value, ind + '  ')}")
            elif isinstance(value, list) and value:
                out.append(f"{ind}{key}:\n{self.sequence(value, ind + '  ')}")
            else:
                out.append(f"{ind}{key}: {self.scalar(value, ind + '  ')}\n")
        return "".join(out)

    def sequence(self, obj: list, ind: str) -> str:
        out = []
        for value in obj:
            if isinstance(value, dict) and value:
                out.append(ind + "- " + self.mapping(value, ind + "  ")[len(ind) + 2:])
            elif isinstance(value, list) and value:
                out.append(f"{ind}-\n{self.sequence(value, ind + '  ')}")
            else:
                out.append(f"{ind}- {self.scalar(value, ind + '  ')}\n")
        return "".join(out)


def indent_lines(text: str, indent: str) -> str:
    """``text`` with every non-empty continuation line indented (empty lines stay empty)."""
    return re.sub(r"\n(?=[^\n])", "\n" + indent, text)


@lru_cache(maxsize=8)
def suite_vectors(suite: str) -> dict[str, dict]:
    """Vector -> its description, default, document kind, reading tools, and the rendered tool output
    split around the vector (``before``, ``after``, the continuation ``indent`` of its value)."""
    root = agentdojo_root() / "data" / "suites" / suite
    environment = _load_yaml(root / "environment.yaml")
    declared = _load_yaml(root / "injection_vectors.yaml") or {}
    defaults = {name: _unescape(str((info or {}).get("default") or "")) for name, info in declared.items()}
    vectors = {}
    for name, info in declared.items():
        where = next((p for p, s in _paths(environment) if "{" + name + "}" in s), None)
        if where is None:
            continue  # declared but not used by this environment
        site_at = max((i for i, k in enumerate(where) if k in SITES), default=None)
        if site_at is None:
            continue
        site = where[site_at]
        kind, tools = SITES[site]
        item = where[: site_at + 2] if len(where) > site_at + 1 else where
        part = _get(environment, item)
        if isinstance(part, str):  # a named string: a file's content, a page's text
            part = {NAME_FIELDS.get(site, "name"): item[-1], "content": part}
        elif not isinstance(part, dict):
            part = _get(environment, where[: site_at + 1])  # a list of names (slack channels)
        if sum(s.count("{" + name + "}") for _, s in _paths(part)) != 1:
            raise WorkbenchError(f"AgentDojo {suite}: vector {name!r} occurs more than once in one document; "
                                 f"this reader expects agentdojo=={VERSION}")
        renderer = _Renderer()
        filled = _fill_placeholders(part, {**defaults, name: _SENTINEL})
        text = renderer.mapping(filled, "") if isinstance(filled, dict) else renderer.sequence(filled, "")
        before, after = text.split(_SENTINEL)
        after = after.removesuffix("\n")  # the renderer's last line break; the block closes on the next line
        vectors[name] = {"description": str((info or {}).get("description") or ""), "default": defaults[name],
                         "kind": kind, "tools": tools, "location": ".".join(map(str, item)),
                         "before": before, "after": after, "indent": renderer.indent}
    return vectors


def _user_prompts(suite: str, vector: dict) -> list[str]:
    """The user tasks that most plausibly read the vector's document: those whose ground truth calls a tool
    that returns it, then those naming the most specific things in it (a hotel, a file, a URL)."""
    documents = [v["before"] + v["default"] + v["after"] for v in suite_vectors(suite).values()]
    document = vector["before"] + vector["default"] + vector["after"]
    tasks = user_tasks(suite)

    def specificity(name: str) -> Fraction:  # 'Le Marais Boutique' says more than 'Paris'
        return Fraction(1, sum(name in d for d in documents)) if name in document else Fraction(0)

    scored = {tid: (bool(t["tools"] & set(vector["tools"])), sum(map(specificity, t["names"]), Fraction(0)))
              for tid, t in tasks.items()}
    best = max(scored.values(), default=(False, Fraction(0)))
    return sorted(tid for tid, score in scored.items() if score == best)


# --- records --------------------------------------------------------------------------------------------------


def _choose(requested, known: tuple[str, ...], what: str) -> tuple[str, ...]:
    if requested is None:
        return known
    requested = (requested,) if isinstance(requested, str) else tuple(requested)
    unknown = [r for r in requested if r not in known]
    if unknown or not requested:
        raise WorkbenchError(f"unknown AgentDojo {what} {(unknown or [''])[0]!r}: use some of {', '.join(known)}")
    return tuple(dict.fromkeys(requested))


def combinations(suites=None, attacks=None) -> list[tuple[str, str, str, str]]:
    """Every (suite, vector, injection task, attack), in a fixed order."""
    suites = _choose(suites, suite_names(), "suite")
    attacks = _choose(attacks, tuple(attack_templates()), "attack")
    return [(s, v, t, a) for s in suites for v in suite_vectors(s) for t in injection_goals(s) for a in attacks]


def _balanced(combos: list[tuple], n_pairs: int, r: random.Random) -> list[tuple]:
    """``n_pairs`` combinations, cycling over (suite, attack) cells so every prefix is balanced across
    suites and across attacks (within one); each cell's combinations in a seeded random order."""
    suites = list(dict.fromkeys(c[0] for c in combos))
    attacks = list(dict.fromkeys(c[3] for c in combos))
    cells: dict[tuple, list] = {}
    for c in combos:
        cells.setdefault((c[0], c[3]), []).append(c)
    for members in cells.values():
        r.shuffle(members)
    S, A = len(suites), len(attacks)
    period = S * A // math.gcd(S, A)
    order = [(suites[k % S], attacks[(k + k // period) % A]) for k in range(S * A)]  # every cell once
    picked, depth = [], 0
    while len(picked) < n_pairs:
        for cell in order:
            if depth < len(cells[cell]) and len(picked) < n_pairs:
                picked.append(cells[cell][depth])
        depth += 1
    return picked


def agentdojo_records(suites=None, attacks=None, n_pairs: int | None = None, seed: int = 0) -> list[dict]:
    """Matched clean/injected user turns from AgentDojo: ``2 * n_pairs`` records, clean then injected per pair.

    ``n_pairs=None`` gives every (suite, vector, injection task, attack) combination; fewer are sampled
    with ``seed``, balanced across suites and attacks. ``text`` is a user request followed by the tool
    output in ``<tool_output>...</tool_output>``; ``span`` is the tool output, ``position`` and
    ``inserted_chars`` the vector's value inside ``text``.
    """
    combos = combinations(suites, attacks)
    if n_pairs is None:
        n_pairs = len(combos)
    if isinstance(n_pairs, bool) or not isinstance(n_pairs, int) or n_pairs < 1:
        raise WorkbenchError(f"n_pairs must be a positive integer, got {n_pairs!r}")
    if n_pairs > len(combos):
        raise WorkbenchError(f"AgentDojo has {len(combos)} distinct (suite, vector, injection task, attack) "
                             f"combinations for this selection; ask for at most that many pairs, not {n_pairs}")
    r = random.Random(f"agentdojo-{seed}")
    chosen = _balanced(combos, n_pairs, r)
    version, templates = agentdojo_version(), attack_templates()
    if version != VERSION:
        log.warning("agentdojo %s is installed; this reader was written against %s", version, VERSION)
    records = []
    for pair, (suite, name, task, attack) in enumerate(chosen):
        vector, goal = suite_vectors(suite)[name], injection_goals(suite)[task]
        user_task = r.choice(_user_prompts(suite, vector))
        prompt = user_tasks(suite)[user_task]["prompt"]
        injected = _fill(templates[attack], goal, prompt)
        head = f"{prompt}\n\n<tool_output>\n"
        for label, value in (("clean", vector["default"]), ("injected", injected)):
            shown = indent_lines(value, vector["indent"] or "")
            output = vector["before"] + shown + vector["after"]
            start = len(head)
            records.append({
                "text": f"{head}{output}\n</tool_output>", "label": label, "pair": pair,
                "span": [start, start + len(output)], "position": start + len(vector["before"]),
                "inserted_chars": len(shown), "inserted": value,
                "inserted_span": [start + len(vector["before"]), start + len(vector["before"]) + len(shown)],
                "source": "agentdojo", "condition": "agentdojo", "agentdojo_version": version,
                "suite": suite, "attack": attack, "injection_task": task, "goal": goal, "vector": name,
                "vector_description": vector["description"], "document_kind": vector["kind"],
                "document": vector["location"], "tool": vector["tools"][0], "user_task": user_task,
                "user_prompt": prompt,
                # the names the synthetic injection condition's consumers read
                "document_type": vector["kind"], "attack_family_of_pair": attack,
            })
    return records
