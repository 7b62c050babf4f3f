import pytest
import torch

from workbench.errors import WorkbenchError
from workbench.models import REGISTRY, format_chat, load_model, resolve
from workbench.models.registry import embedded_gguf

PROMPTS = ["The capital of France is", "def fibonacci(n):\n    return", "Once upon a time, a small robot"]


def test_registry_names_and_aliases():
    for name in ["smollm2-135m", "gemma3-270m", "tiny", "llama-8b", "llama-70b", "gemma2-9b", "gpt2", "pythia-70m-deduped"]:
        assert name in REGISTRY
    assert resolve("default").name == "smollm2-135m"
    assert resolve(None).name == "smollm2-135m"
    assert resolve("llama-8b").hf_id == "meta-llama/Llama-3.1-8B-Instruct"
    spec = resolve("someorg/some-model")
    assert spec.source == "hf" and spec.hf_id == "someorg/some-model"
    # TransformerLens's own names and aliases mean what they mean there
    assert (resolve("gpt2-small").hf_id, resolve("gpt2-small").tl_name) == ("gpt2", "gpt2")
    assert resolve("pythia-70m").hf_id == "EleutherAI/pythia-70m"
    assert resolve("Pythia-70M-deduped").hf_id == "EleutherAI/pythia-70m-deduped"
    assert resolve("gpt2-medium").source == "hf" and resolve("gpt2-medium").tl_name == "gpt2-medium"


def test_unknown_model_is_one_clear_line():
    with pytest.raises(WorkbenchError, match="unknown model 'nonsense'.*smollm2-135m") as err:
        resolve("nonsense")
    assert "\n" not in str(err.value)


def test_bad_model_path(tmp_path):
    with pytest.raises(WorkbenchError, match="does not exist"):
        resolve("x", model_path=tmp_path / "missing")
    with pytest.raises(WorkbenchError, match="no config.json"):
        resolve("x", model_path=tmp_path)


def test_missing_weights_offline_is_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(WorkbenchError) as err:
        load_model("llama-8b", device="cpu")
    message = str(err.value)
    assert "meta-llama/Llama-3.1-8B-Instruct" in message and "--model-path" in message and "hf download" in message
    assert "\n" not in message


def test_hub_check_goes_through_urllib_so_proxies_count(monkeypatch):
    import urllib.error
    import urllib.request

    from workbench.models import loading

    asked = []

    def answer(outcome):
        def urlopen(request, timeout):
            asked.append((request.get_method(), request.full_url))
            if isinstance(outcome, Exception):
                raise outcome
            return outcome
        return urlopen

    class Response:
        def close(self):
            pass

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.example")
    monkeypatch.setattr(urllib.request, "urlopen", answer(Response()))
    assert loading.hub_reachable() and asked == [("HEAD", "https://hub.example")]
    monkeypatch.setattr(urllib.request, "urlopen", answer(urllib.error.HTTPError("u", 403, "no", {}, None)))
    assert loading.hub_reachable()  # an answer, even a refusal, is a hub that is there
    monkeypatch.setattr(urllib.request, "urlopen", answer(urllib.error.URLError("proxy refused")))
    assert not loading.hub_reachable()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    asked.clear()
    assert not loading.hub_reachable() and asked == []


def test_tiny_is_deterministic_by_seed():
    a, b, c = (load_model("tiny", seed=s, device="cpu") for s in (0, 0, 1))
    tokens = a.to_tokens("hello")
    assert torch.equal(a(tokens), b(tokens))
    assert not torch.allclose(a(tokens), c(tokens))
    assert a.workbench["weights_sha256"] == b.workbench["weights_sha256"] != c.workbench["weights_sha256"]


def test_format_chat(tiny):
    text = format_chat(tiny, "hi there", system="be brief")
    assert "hi there" in text and "be brief" in text and text.endswith("<|assistant|>")


def test_format_chat_without_template_fails_clearly(tiny):
    template = tiny.tokenizer.chat_template
    tiny.tokenizer.chat_template = None
    try:
        with pytest.raises(WorkbenchError, match="no chat template"):
            format_chat(tiny, "hi")
    finally:
        tiny.tokenizer.chat_template = template


def test_local_hf_folder_matches_transformers(tmp_path):
    """A local HF folder (named with 'llama' in its path, which trips TransformerLens's name rules) loads."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from workbench.models.tiny import byte_tokenizer

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=259, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    hf = LlamaForCausalLM(config).eval()
    folder = tmp_path / "my-llama-local"
    hf.save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    model = load_model(str(folder), device="cpu")
    tokens = torch.tensor([[256, 72, 101, 108, 108, 111, 32, 119]])
    with torch.no_grad():
        assert torch.allclose(model(tokens), hf(tokens).logits, atol=1e-4)
    assert model.workbench["source"] == "local"


def _hf_logits_from_gguf(spec_name, prompts, prepend_bos):
    """Reference logits from transformers on the same GGUF, cached per (file, transformers version, prompts).

    Dequantizing Gemma's GGUF through transformers takes over a minute on 2 cores; the reference only
    changes when the file, the prompts or transformers change, and all three are in the cache key.
    """
    import hashlib
    import json

    import transformers
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workbench.models.loading import file_sha256
    from workbench.paths import cache_dir

    gguf = embedded_gguf(resolve(spec_name))
    key = hashlib.sha256(json.dumps([file_sha256(gguf), transformers.__version__, prompts, prepend_bos]).encode())
    cached = cache_dir("test-reference") / f"{spec_name}-{key.hexdigest()[:16]}.safetensors"
    if cached.exists():
        saved = load_file(str(cached))
        return [(saved[f"ids{i}"], saved[f"logits{i}"]) for i in range(len(prompts))]
    hf = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    out = []
    for prompt in prompts:
        ids = tok(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        if prepend_bos:
            ids = torch.cat([torch.tensor([[tok.bos_token_id]]), ids], dim=1)
        with torch.no_grad():
            out.append((ids, hf(ids).logits))
    save_file({**{f"ids{i}": ids for i, (ids, _) in enumerate(out)},
               **{f"logits{i}": lg.contiguous() for i, (_, lg) in enumerate(out)}}, str(cached))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_embedded_logits_match_transformers(name, request):
    model = request.getfixturevalue(name.split("-")[0])
    assert model.workbench["source"] == "embedded" and len(model.workbench["weights_sha256"]) == 64
    for ids, hf_logits in _hf_logits_from_gguf(name, PROMPTS, model.cfg.default_prepend_bos):
        with torch.no_grad():
            ours = model(ids)
        assert (ours - hf_logits).abs().max().item() < 1e-3


@pytest.mark.slow
def test_second_load_comes_from_the_cache(smollm2):
    again = load_model("smollm2-135m", device="cpu")
    assert again.workbench["cached"] is True
    assert again.workbench["weights_sha256"] == smollm2.workbench["weights_sha256"]
    tokens = torch.tensor([[504, 3575, 282, 4649, 314]])
    with torch.no_grad():
        assert torch.equal(again(tokens), smollm2(tokens))


@pytest.mark.slow
def test_smollm2_answers_through_its_chat_template(smollm2):
    prompt = format_chat(smollm2, "What is the capital of France?")
    answer = smollm2.generate(prompt, max_new_tokens=10, do_sample=False, verbose=False, prepend_bos=False)
    assert "Paris" in answer[len(prompt) - 40 :]


def test_derived_model_registration(tmp_path, monkeypatch):
    from safetensors.torch import save_file

    from workbench.models.registry import register_derived

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    base = load_model("tiny", device="cpu")
    changed = {"blocks.0.mlp.W_out": base.blocks[0].mlp.W_out.detach() * 2}
    save_file({k: v.contiguous() for k, v in changed.items()}, str(tmp_path / "delta.safetensors"))
    register_derived("tiny-doubled", "tiny", tmp_path / "delta.safetensors", "test fine-tune")
    derived = load_model("tiny-doubled", device="cpu")
    assert torch.equal(derived.blocks[0].mlp.W_out, base.blocks[0].mlp.W_out * 2)
    assert torch.equal(derived.blocks[1].mlp.W_out, base.blocks[1].mlp.W_out)
    assert derived.workbench["name"] == "tiny-doubled" and derived.workbench["base"] == "tiny"
    with pytest.raises(WorkbenchError, match="built-in model name"):
        register_derived("tiny", "tiny", tmp_path / "delta.safetensors")
    (tmp_path / "delta.safetensors").unlink()
    with pytest.raises(WorkbenchError, match="missing"):
        load_model("tiny-doubled", device="cpu")


def test_auto_dtype_is_bfloat16_only_where_the_cpu_computes_it(tmp_path, monkeypatch):
    from workbench.models import loading

    with_bf16, without = tmp_path / "with", tmp_path / "without"
    with_bf16.write_text("flags\t\t: fpu sse2 avx512f avx512_bf16 amx_tile\n")
    without.write_text("flags\t\t: fpu sse2 avx2 avx512f\n")
    assert loading.fast_bfloat16("cpu", with_bf16) and not loading.fast_bfloat16("cpu", without)
    assert not loading.fast_bfloat16("cpu", tmp_path / "absent") and not loading.fast_bfloat16("mps")
    for native, expect in ((True, "bfloat16"), (False, "float32")):
        monkeypatch.setattr(loading, "fast_bfloat16", lambda device, native=native: native)
        assert loading.load_model("tiny", device="cpu", dtype="auto").workbench["dtype"] == expect
    with pytest.raises(WorkbenchError, match="use auto or one of"):
        loading.load_model("tiny", device="cpu", dtype="float8")


def test_weights_edited_in_place_get_their_own_identity():
    """A notebook's ablation, a fine-tune in place or quantized weights are not the weights the recorded hash
    names: every cache keyed by the model's identity must see them as other weights, and weights restored exactly
    by a quantization block are the loaded ones again."""
    from workbench.models import model_identity
    from workbench.tools.quant import quantized_weights

    model = load_model("tiny", device="cpu")
    loaded = model_identity(model)["weights_sha256"]
    with quantized_weights(model, bits=4, group_size=None):
        quantized = model_identity(model)["weights_sha256"]
    assert quantized.startswith("edited-") and quantized != loaded
    assert model_identity(model)["weights_sha256"] == loaded
    w = model.blocks[0].mlp.W_out
    with torch.no_grad():
        w[0, 0] += 1.0
    edited = model_identity(model)["weights_sha256"]
    assert edited.startswith("edited-") and edited not in (loaded, quantized)
    with torch.no_grad():
        w[0, 0] -= 1.0  # undone by hand: hashed again (a cache may miss, never serve the edited weights' results)
    assert model_identity(model)["weights_sha256"] not in (edited, quantized)
