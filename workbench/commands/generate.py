"""``workbench generate``: plain generation, or (Soft) Best-of-N under a reward, with optional steering."""

from __future__ import annotations

from collections.abc import Sequence

from workbench.errors import WorkbenchError
from workbench.tools.generate import (
    Reward,
    best_of_n,
    check_sampling,
    generate,
    parse_reward,
    parse_steer,
    soft_best_of_n,
    steer_hooks,
    target_logprob_reward,
)


def _cli_reward(model, spec: str | None) -> Reward | None:
    """``target:TEXT`` (log-prob of TEXT after the sample under the unhooked model) or None."""
    target = parse_reward(spec)
    return None if target is None else target_logprob_reward(model, target)


def run_generate(model: str = "smollm2-135m", prompt: str = "", max_new_tokens: int = 64,
                 temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, stop: Sequence[str] = (),
                 chat: bool = False, best_of: int = 1, lam: float | None = None, reward: str | None = None,
                 steer: str | None = None, seed: int = 0, parse_special: bool = False) -> dict:
    """``workbench generate``: plain generation, or (Soft) Best-of-N when ``best_of > 1``.

    ``lam`` None is hard Best-of-N; ``reward`` is ``target:TEXT`` (required with ``best_of > 1``).
    The reward is scored by the unsteered model, so steering is judged from outside. Every value is
    checked before the model loads; what needs the model (context length, layer ranges) right after.
    """
    from workbench.models import load_model

    if not isinstance(prompt, str) or not prompt:
        raise WorkbenchError("--prompt must be a non-empty string.")
    if best_of < 1:
        raise WorkbenchError(f"best_of={best_of} must be >= 1.")
    check_sampling(temperature, top_p, top_k, best_of, max_new_tokens)
    if lam is not None and not lam > 0:
        raise WorkbenchError(f"--lambda {lam} must be > 0 (omit it for hard Best-of-N).")
    if best_of == 1 and (lam is not None or reward is not None):
        raise WorkbenchError("--lambda and --reward select among samples: use them with --best-of > 1.")
    if best_of > 1 and reward is None:
        raise WorkbenchError("--best-of > 1 needs a reward, e.g. --reward 'target: Paris'.")
    parse_reward(reward)
    parse_steer(steer)
    m = load_model(model)
    hooks = steer_hooks(m, steer)
    kwargs = dict(hooks=hooks, max_new_tokens=max_new_tokens, top_p=top_p, top_k=top_k, stop=stop, chat=chat,
                  parse_special=parse_special)
    base = {"model": model, "prompt": prompt, "steer": steer, "seed": seed}
    if best_of == 1:
        s = generate(m, prompt, temperature=temperature, seed=seed, **kwargs)[0]
        return {**base, "text": s["text"], "sample": s}
    r = _cli_reward(m, reward)
    temperature = temperature or 1.0
    if lam is None:
        out = best_of_n(m, prompt, r, best_of, seed=seed, temperature=temperature, **kwargs)
    else:
        out = soft_best_of_n(m, prompt, r, best_of, lam, seed=seed, temperature=temperature, **kwargs)
    return {**base, "text": out["sample"]["text"], **out}
