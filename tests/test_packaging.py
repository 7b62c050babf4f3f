"""The package installs what the folders hold, and the kernels folder shadows no other distribution."""

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _setuptools_config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_package_list_matches_the_folders():
    cfg = _setuptools_config()
    found = {
        ".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "workbench").rglob("__init__.py")
    }
    mapped = set(cfg["package-dir"])
    assert set(cfg["packages"]) == found | mapped, "pyproject.toml [tool.setuptools] packages is out of date"
    for name, folder in cfg["package-dir"].items():
        assert (ROOT / folder / "__init__.py").is_file(), f"{name} maps to {folder}, which is no package"


def test_no_top_level_kernels_package():
    # A regular package named `kernels` at the root would win over the PyPI `kernels` that transformers imports.
    assert not (ROOT / "kernels" / "__init__.py").exists()


_PROBE = (
    "import importlib.util, json\n"
    "from transformers.utils import is_kernels_available\n"
    "import transformers.integrations.hub_kernels\n"
    "spec = importlib.util.find_spec('kernels')\n"
    "origin = spec.origin if spec else None\n"
    "import workbench.kernels as wk\n"
    "print(json.dumps([is_kernels_available(), origin, wk.__name__]))\n"
)


def _probe(cwd: Path) -> list:
    import json

    out = subprocess.run([sys.executable, "-c", _PROBE], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_transformers_kernels_check_is_unaffected_by_the_checkout(tmp_path):
    # `python -c` puts the working directory first on sys.path: from the repo root as from anywhere else,
    # `kernels` must resolve to the same place (the PyPI package or nothing), never to this checkout.
    from_root, elsewhere = _probe(ROOT), _probe(tmp_path)
    assert from_root == elsewhere
    origin = from_root[1]
    assert origin is None or not Path(origin).resolve().is_relative_to(ROOT / "kernels")
    assert from_root[2] == "workbench.kernels"


def test_kernels_import_only_arrays_and_errors():
    # import-linter walks workbench/ only; the kernels (kernels/src) get the same rule here: no model code.
    import ast

    allowed = {"torch", "numpy", "triton", "numba", "os", "functools", "collections", "typing", "__future__",
               "math", "dataclasses", "workbench.errors"}
    for path in (ROOT / "kernels" / "src").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                assert any(name == a or name.startswith(a + ".") for a in allowed), f"{path.name} imports {name}"


def test_every_optional_module_names_an_extra_that_exists_and_fails_in_one_line(monkeypatch, capsys):
    import importlib.util

    import pytest

    from workbench import cli
    from workbench.commands.sae import run_train
    from workbench.errors import EXTRAS, WorkbenchError

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert set(EXTRAS.values()) <= set(project["optional-dependencies"])
    assert not any(d.startswith(("persim", "playwright", "gemma3")) for d in project["dependencies"])
    assert not any(d.startswith("playwright") for d in project["optional-dependencies"]["app"])  # a test tool
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sae_lens" else real(name, *a))
    with pytest.raises(WorkbenchError, match=r"sae_lens is not installed: pip install 'workbench\[sae\]'"):
        run_train(model="tiny", site="blocks.0.hook_resid_post")  # refused before any model load or collection

    def missing(args=None):
        raise ModuleNotFoundError("No module named 'ray'", name="ray")

    monkeypatch.setattr(cli, "app", missing)
    with pytest.raises(SystemExit) as code:
        cli.main(["study", "run", "x.yaml"])
    assert code.value.code == 2
    assert capsys.readouterr().err.strip() == "error: ray is not installed: pip install 'workbench[ray]'"
