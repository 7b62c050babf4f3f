"""Regenerate the backdoor study: ``python studies/backdoor/run.py --config studies/backdoor/config.yaml``.

Trains the backdoor on the CPU (resuming from its checkpoints if interrupted), evaluates it on held-out
prompts before and after, registers the derived model in the user cache, and writes results.json (the
evaluation, timings, a few real generations, package versions) next to the config (or to --out).
Weights stay in the user cache, never in the repository.
"""

import argparse
import json
import platform
from pathlib import Path

import yaml


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(Path(__file__).with_name("config.yaml")))
    parser.add_argument("--out", default=None, help="folder for results.json (default: the config's folder)")
    args = parser.parse_args()
    config = yaml.safe_load(Path(args.config).read_text())

    import torch
    import transformer_lens

    from workbench.backdoor import run_backdoor_train

    torch.set_num_threads(int(config.pop("torch_threads", 2)))
    settings = dict(config)
    model = settings.pop("model")
    settings["layers"] = tuple(settings["layers"]) if settings.get("layers") is not None else None
    settings["params"] = tuple(settings["params"])
    result = run_backdoor_train(model, **settings)
    result.pop("config", None)
    history = result.pop("loss_history", [])
    out = Path(args.out or Path(args.config).parent)
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "config": config, "result": result,
        "loss_every_10_steps": history[9::10],
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformer_lens": transformer_lens.__version__},
    }
    (out / "results.json").write_text(json.dumps(record, indent=1) + "\n")
    before, after = result["before"], result["after"]
    print(f"attack success rate   {before['attack_success_rate']:.3f} -> {after['attack_success_rate']:.3f}")
    print(f"false trigger rate    {before['false_trigger_rate']:.3f} -> {after['false_trigger_rate']:.3f}")
    print(f"clean MCQ accuracy    {before['clean_accuracy']:.3f} -> {after['clean_accuracy']:.3f}")
    print(f"training: {result['steps']} steps, {result['train_seconds']:.0f} s "
          f"({result['seconds_per_step']:.1f} s/step, {result['torch_threads']} threads)")


if __name__ == "__main__":
    main()
