import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from workbench.cli import app

runner = CliRunner()
COMMANDS = ["detect eval", "corpus", "models", "sites", "capture", "probe", "topology", "detect", "study run", "backdoor train",
            "backdoor eval", "sae train", "sae features", "sae interference", "sae intervene", "quant eval",
            "attention eval", "generate"]


def test_help_is_fast_and_light():
    """`workbench --help` must not import torch or transformer_lens."""
    code = "import sys; from workbench.cli import app; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command):
    result = runner.invoke(app, [*command.split(), "--help"])
    assert result.exit_code == 0 and "Usage" in result.output


def test_models_lists_registry():
    result = runner.invoke(app, ["models"])
    assert result.exit_code == 0
    for name in ["smollm2-135m", "gemma3-270m", "tiny", "llama-8b", "meta-llama/Llama-3.1-8B-Instruct"]:
        assert name in result.output


def test_capture_command_on_tiny(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"text": f"prompt {i}", "label": i % 2}) for i in range(5)))
    result = runner.invoke(app, ["capture", "--model", "tiny", "--prompts", str(prompts), "--layers", "0,3",
                                 "--sites", "blocks.1.hook_mlp_out", "--out", str(tmp_path / "s")])
    assert result.exit_code == 0, result.output
    assert "5/5 rows" in result.output and "blocks.3.hook_resid_post" in result.output
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert manifest["sites"] == ["blocks.1.hook_mlp_out", "blocks.0.hook_resid_post", "blocks.3.hook_resid_post"]


def test_json_replaces_the_table_of_every_table_command(tmp_path):
    import numpy as np

    models = json.loads(runner.invoke(app, ["models", "--json"]).stdout)
    assert {m["name"] for m in models} >= {"smollm2-135m", "tiny"} and sum(m["default"] for m in models) == 1
    sites = json.loads(runner.invoke(app, ["sites", "--model", "tiny", "--contains", "resid_post", "--json"]).stdout)
    assert sites == [f"blocks.{i}.hook_resid_post" for i in range(4)]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"text": f"prompt {i}"}) for i in range(3)))
    result = runner.invoke(app, ["capture", "--model", "tiny", "--prompts", str(prompts), "--layers", "1",
                                 "--out", str(tmp_path / "s"), "--json"])
    assert result.exit_code == 0, result.output
    store = json.loads(result.stdout)
    assert (store["rows"], store["sites"]["blocks.1.hook_resid_post"]["shape"]) == (3, [3, 64])
    angles = np.linspace(0, 2 * np.pi, 40, endpoint=False)
    np.save(tmp_path / "circle.npy", np.c_[np.cos(angles), np.sin(angles)])
    result = runner.invoke(app, ["topology", "--points", str(tmp_path / "circle.npy"), "--out", str(tmp_path / "o"),
                                 "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["dims"]["H1"]["bars"] == 1


def test_user_errors_are_one_line_with_exit_code_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "workbench.cli", "capture", "--model", "nonsense",
                           "--prompts", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "s")],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: prompt file") and proc.stderr.strip().count("\n") == 0
    assert "Traceback" not in proc.stderr


def test_topology_command_on_a_circle(tmp_path):
    import numpy as np

    angles = np.linspace(0, 2 * np.pi, 60, endpoint=False)
    np.save(tmp_path / "circle.npy", np.c_[np.cos(angles), np.sin(angles)])
    result = runner.invoke(app, ["topology", "--points", str(tmp_path / "circle.npy"), "--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    assert "H1: 1 bars" in result.output
    doc = json.loads((tmp_path / "o" / "diagrams.json").read_text())
    assert len(doc["dgms"][1]) == 1 and doc["dgms"][0][-1][1] is None


def test_generate_command_on_tiny():
    result = runner.invoke(app, ["generate", "--model", "tiny", "--prompt", "hello", "--max-new-tokens", "4"])
    assert result.exit_code == 0, result.output
    assert "text" in json.loads(result.output)


def test_version_from_the_module_and_the_script():
    from workbench import __version__

    out = subprocess.run([sys.executable, "-m", "workbench", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"workbench {__version__}"


def test_shell_completion_completes_commands_and_options(monkeypatch):
    import os
    import shutil

    import shellingham

    # --show-completion detects the shell through shellingham, which can fail to read this process's ancestry
    # (it did once after a Ray cluster had run in the same test process): the script is what is checked here
    monkeypatch.setattr(shellingham, "detect_shell", lambda *a, **k: ("bash", "/bin/bash"))

    script = shutil.which("workbench", path=str(Path(sys.executable).parent)) or "workbench"
    env = {**os.environ, "_WORKBENCH_COMPLETE": "complete_bash", "COMP_WORDS": "workbench det", "COMP_CWORD": "1"}
    out = subprocess.run([script], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == ["detect"]
    env.update(COMP_WORDS="workbench detect --pro", COMP_CWORD="2")
    assert subprocess.run([script], capture_output=True, text=True, env=env, check=True).stdout.split() == ["--prompts"]
    shown = CliRunner().invoke(app, ["--show-completion", "bash"], prog_name="workbench")
    assert shown.exit_code == 0 and "complete" in shown.output, (shown.output, shown.exception)


def test_quiet_silences_every_progress_bar(monkeypatch):
    import io
    import os

    from workbench.progress import progress_bar

    monkeypatch.setenv("TQDM_DISABLE", "")  # restored after the test: --quiet sets it for the process
    assert CliRunner().invoke(app, ["--quiet", "models"]).exit_code == 0
    assert os.environ["TQDM_DISABLE"] == "1"
    shown = io.StringIO()
    assert list(progress_bar(range(2), disable=False, file=shown)) == [0, 1] and shown.getvalue() == ""
