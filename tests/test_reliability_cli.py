"""Bad input to the commands no other reliability table covers: one line, exit 2, nothing written."""

import json

import pytest

from tests.cli_harness import assert_refused


@pytest.fixture
def work(tmp_path):
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps({"text": f"hello {i}", "label": "a"}) for i in range(4)))
    (tmp_path / "afile").write_text("x")
    return tmp_path


CAPTURE = ["capture", "--model", "tiny", "--prompts", "{w}/p.jsonl"]
CASES = [
    (["sites", "--model", "tiny", "--device", "tpu"], "unknown device"),
    (["sites", "--model", "nonexistent-org/model-xyz"], "nonexistent-org/model-xyz"),
    (["sites", "--model", "tiny", "--model-path", "{w}/nothing"], "does not exist"),
    (["sites", "--model", "tiny", "--model-path", "{w}/afile"], ""),
    ([*CAPTURE, "--out", "{w}/afile", "--layers", "1"], "afile"),
    ([*CAPTURE, "--out", "{w}/afile/sub", "--layers", "1"], "is a file"),
    ([*CAPTURE, "--out", "{w}/o"], "no sites given"),
    ([*CAPTURE, "--out", "{w}/o", "--layers", "1", "--positions", "first"], "unknown positions"),
    ([*CAPTURE, "--out", "{w}/o", "--layers", "1", "--store-dtype", "int8"], "unknown store dtype"),
    ([*CAPTURE, "--out", "{w}/o", "--layers", "1", "--batch-size", "0"], "at least 1"),
    ([*CAPTURE, "--out", "{w}/o", "--sites", "blocks.1.hook_pattern"], "did you mean"),
    ([*CAPTURE, "--out", "{w}/o", "--sites", "blocks.1.attn.hook_pattern"], "no single position axis"),
    ([*CAPTURE, "--out", "{w}/o", "--layers", "1", "--positions", "span"], "needs a 'span'"),
    ([*CAPTURE, "--out", "{w}/o", "--layers", "1", "--dtype", "float8"], "unknown dtype"),
    ([*CAPTURE, "--out", "{w}/o", "--layers", "4"], "out of range"),
    ([*CAPTURE, "--out", "{w}/o", "--layers", "one"], "comma-separated integers"),
    ([*CAPTURE, "--out", "{w}/o", "--layers", "1", "--batch-size", "x"], "invalid value"),
    (["capture", "--model", "tiny", "--prompts", "{w}/missing.jsonl", "--out", "{w}/o", "--layers", "1"],
     "does not exist"),
    (["capture", "--model", "tiny", "--prompts", "{w}/afile", "--out", "{w}/o", "--layers", "1"], "not valid JSON"),
    (["study", "run", "{w}/afile"], "is not a study config"),
    (["study", "run", "{w}/missing.yaml"], "does not exist"),
    (["sae", "features", "no-such-sae", "--model", "tiny"], "neither an SAE folder"),
    (["sae", "interference", "no-such-sae", "--model", "tiny"], "neither an SAE folder"),
    (["sae", "intervene", "no-such-sae", "--model", "tiny", "--prompt", "hi"], "neither an SAE folder"),
    (["backdoor", "eval", "--model", "tiny"], "not a backdoored model"),
    (["generate", "--model", "tiny", "--prompt", ""], "non-empty"),
    (["quant", "eval", "--model", "tiny", "--settings", "nope"], "unknown quantization setting"),
    (["attention", "eval", "--model", "tiny", "--methods", "nope"], "unknown sparse-attention method"),
    (["--progress-file", "{w}", "sites", "--model", "tiny"], "is a folder: give a file path"),
    (["probe", "--model", "tiny", "--condition", "injection,nope", "--out", "{w}/p"], "unknown condition 'nope'"),
    (["probe", "--model", "tiny", "--condition", ",", "--out", "{w}/p"], "unknown condition ','"),
]


@pytest.mark.parametrize(("argv", "expect"), CASES, ids=[" ".join(c[0][:4]) + f"-{i}" for i, c in enumerate(CASES)])
def test_refused(work, argv, expect):
    assert_refused([a.format(w=work) for a in argv], expect, watch=(work,))
