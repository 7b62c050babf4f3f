"""Loading without a second copy: the safetensors reader, weights assigned into a model built on the meta device,
and the same numbers as transformers' own loader in every dtype."""

import threading

import pytest
import torch

from workbench.errors import WorkbenchError
from workbench.models import checkpoint as ckpt
from workbench.models import load_model
from workbench.models.loading import parameters_on_meta


def _llama_folder(tmp_path, name, tie, safe=True, shard=None):
    from transformers import LlamaConfig, LlamaForCausalLM

    from workbench.models.tiny import byte_tokenizer

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=259, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         tie_word_embeddings=tie)
    hf = LlamaForCausalLM(config).eval()
    folder = tmp_path / name
    hf.save_pretrained(folder, **({"max_shard_size": shard} if shard else {}))
    if not safe:  # an older checkpoint: a pickled state dict (transformers 5 writes only safetensors)
        (folder / "model.safetensors").unlink()
        torch.save(hf.state_dict(), folder / "pytorch_model.bin")
    byte_tokenizer().save_pretrained(folder)
    return folder, hf


TOKENS = torch.tensor([[256, 72, 101, 108, 108, 111, 32, 119]])


@pytest.mark.parametrize("tie,shard", [(False, None), (True, "60KB")])
def test_hf_folder_loads_through_the_reader_and_matches_transformers(tmp_path, tie, shard):
    """Tied embeddings and a sharded checkpoint (an index file) load through the reader, logits as transformers'."""
    from transformers import AutoConfig

    from workbench.models.loading import hf_from_checkpoint

    folder, hf = _llama_folder(tmp_path, f"llama-{tie}", tie, shard=shard)
    assert (folder / ckpt.INDEX).exists() == bool(shard)
    assert hf_from_checkpoint(AutoConfig.from_pretrained(folder), folder, torch.float32) is not None  # not the fallback
    model = load_model(str(folder), device="cpu")
    with torch.no_grad():
        assert torch.allclose(model(TOKENS), hf(TOKENS).logits, atol=1e-4)
    assert not any(p.is_meta for p in model.parameters())


def test_bfloat16_load_equals_float32_load_cast(tmp_path):
    """Read straight into bfloat16, the weights are bit for bit those of a float32 load cast afterwards."""
    folder, _ = _llama_folder(tmp_path, "llama-bf16", tie=True)
    direct = load_model(str(folder), device="cpu", dtype="bfloat16")
    cast = load_model(str(folder), device="cpu", dtype="float32").to(torch.bfloat16)
    ours, theirs = direct.state_dict(), cast.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert all(p.dtype == torch.bfloat16 and p.is_contiguous() for p in direct.parameters())


def test_a_checkpoint_without_safetensors_falls_back_to_transformers(tmp_path):
    from transformers import AutoConfig

    from workbench.models.loading import hf_from_checkpoint

    folder, hf = _llama_folder(tmp_path, "llama-bin", tie=False, safe=False)
    assert hf_from_checkpoint(AutoConfig.from_pretrained(folder), folder, torch.float32) is None
    model = load_model(str(folder), device="cpu")
    with torch.no_grad():
        assert torch.allclose(model(TOKENS), hf(TOKENS).logits, atol=1e-4)


def test_reader_converts_in_chunks_and_refuses_a_damaged_file(tmp_path, monkeypatch):
    from safetensors.torch import load_file, save_file

    tensors = {"a": torch.randn(37, 19), "b": torch.arange(10, dtype=torch.int64), "c": torch.randn(5).bfloat16()}
    save_file(tensors, str(tmp_path / "x.safetensors"))
    monkeypatch.setattr(ckpt, "CHUNK_BYTES", 64)  # many chunks per tensor
    reader = ckpt.Checkpoint([tmp_path / "x.safetensors"])
    assert sorted(reader.keys()) == ["a", "b", "c"] and reader.shape("a") == (37, 19)
    reference = load_file(str(tmp_path / "x.safetensors"))
    assert all(torch.equal(reader.read(k), reference[k]) for k in tensors)
    assert torch.equal(reader.read("a", torch.bfloat16), reference["a"].bfloat16())
    assert torch.equal(reader.read("c", torch.float32), reference["c"].float())
    data = (tmp_path / "x.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[:-40])
    with pytest.raises(WorkbenchError, match="truncated"):
        ckpt.Checkpoint([tmp_path / "cut.safetensors"]).read("c")
    (tmp_path / "junk.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(WorkbenchError, match="not a readable safetensors file"):
        ckpt.Checkpoint([tmp_path / "junk.safetensors"])


def test_parameters_on_meta_only_in_the_building_thread():
    """Another thread building a module meanwhile (the app serves several sessions) gets real parameters."""
    built, go, done = {}, threading.Event(), threading.Event()

    def other():
        go.wait()
        built["other"] = torch.nn.Linear(3, 3)
        done.set()

    thread = threading.Thread(target=other)
    thread.start()
    with parameters_on_meta():
        built["here"] = torch.nn.Linear(3, 3)
        go.set()
        done.wait(10)
    thread.join()
    assert built["here"].weight.is_meta and not built["other"].weight.is_meta
    assert not torch.nn.Linear(2, 2).weight.is_meta  # restored afterwards


def test_a_checkpoint_bigger_than_the_host_is_refused_before_reading(tmp_path, monkeypatch):
    """Llama-3-70B's config beside a stub shard: refused from the shapes alone, in one line, nothing read."""
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    from workbench.models import loading
    from workbench.models.tiny import byte_tokenizer

    folder = tmp_path / "llama-70b-shaped"
    LlamaConfig(hidden_size=8192, intermediate_size=28672, num_attention_heads=64, num_key_value_heads=8,
                num_hidden_layers=80, vocab_size=128256, tie_word_embeddings=False).save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    save_file({"model.embed_tokens.weight": torch.zeros(2, 2)}, str(folder / "model.safetensors"))
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       25000000 kB\nMemFree:         1000000 kB\nMemAvailable:   20000000 kB\n")
    real = loading.available_host_bytes
    assert real(meminfo) == 20_000_000 * 1024 and real(tmp_path / "none") is None
    monkeypatch.setattr(loading, "available_host_bytes", lambda path="/proc/meminfo": real(meminfo))
    with pytest.raises(WorkbenchError, match=r"needs 141\.\d GB of host memory to load and 20\.5 GB are available"):
        load_model(model_path=folder, device="cpu", dtype="bfloat16")
