"""Generation on the hooked model, and (Soft) Best-of-N selection with pluggable rewards.

``generate`` decodes with a real KV cache while any list of ``(hook_name, fn)`` hooks is
active at every step (prefill and decode), so feature steering, neuron patches, fake
quantization and sparse attention change what the model *says*, not only what it scores.
Each sample carries its log-probability under the distribution it was drawn from, which
is what a KL estimate against the base sampler needs.

Soft Best-of-N (REFERENCES.md, "Best-of-N through the smoothing lens"): draw N samples,
pick i with probability ``softmax(r / λ)_i``; λ → 0 is hard Best-of-N, λ → ∞ a random
sample. For rewards in [0, 1] the selected distribution π satisfies
``KL(π || base) <= log(N / (1 + (N - 1) e^{-1/λ}))``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from workbench.errors import WorkbenchError
from workbench.models.kv_cache import new_cache
from workbench.tools.decoding import decode_loop

Hook = tuple[str, Callable]
Reward = Callable[[str, str], float]


# ----------------------------------------------------------------------------- sampling


def check_sampling(temperature: float, top_p: float, top_k: int, n: int, max_new_tokens: int) -> None:
    if not 0 <= temperature < math.inf:
        raise WorkbenchError(f"temperature={temperature} must be a finite number >= 0 (0 is greedy).")
    if not 0 < top_p <= 1:
        raise WorkbenchError(f"top_p={top_p} must be in (0, 1].")
    if top_k < 0:
        raise WorkbenchError(f"top_k={top_k} must be >= 0 (0 keeps every token).")
    if n < 1:
        raise WorkbenchError(f"n={n} must be >= 1 (the number of samples).")
    if max_new_tokens < 1:
        raise WorkbenchError(f"max_new_tokens={max_new_tokens} must be >= 1.")


def prompt_ids(model, prompt: str, chat: bool = False, parse_special: bool = False) -> list[int]:
    """Token ids of ``prompt`` (through the chat template when ``chat``), BOS by the model's convention.

    Never truncated (callers check the context); the prompt is text unless ``parse_special``: only the
    template's markup becomes control tokens.
    """
    from workbench.capture import tokenize
    from workbench.models import chat_record

    if not isinstance(prompt, str) or not prompt:
        raise WorkbenchError("prompt must be a non-empty string.")
    text = chat_record(model, prompt)["text"] if chat else prompt
    ids = tokenize(model, [text], None, parse_special)[0][0]
    bos = model.tokenizer.bos_token_id
    if chat and len(ids) > 1 and ids[0] == ids[1] == bos:  # templates that write the BOS text themselves
        ids = ids[1:]
    return ids


def text_ids(model, text: str) -> list[int]:
    """Ids of a continuation or target string, as text (no BOS, control-token strings not parsed)."""
    from workbench.capture import encode_text

    return encode_text(model.tokenizer, text)[0]


def _check_fits(model, n_tokens: int, what: str) -> None:
    if n_tokens > model.cfg.n_ctx:
        raise WorkbenchError(f"{what} is {n_tokens} tokens, more than the context of {model.cfg.model_name} "
                             f"({model.cfg.n_ctx}): shorten it")


def sampling_logprobs(logits: torch.Tensor, temperature: float, top_p: float = 1.0, top_k: int = 0) -> torch.Tensor:
    """Log-probabilities ``[b, vocab]`` of the distribution actually sampled from (-inf outside top-k/top-p).

    Greedy (temperature 0) is the point mass on the argmax, so its samples have log-probability 0.
    """
    logits = logits.float()
    if temperature == 0:
        out = torch.full_like(logits, float("-inf"))
        return out.scatter(-1, logits.argmax(-1, keepdim=True), 0.0)
    logits = logits / temperature
    if top_k and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1:
        sorted_logits, order = logits.sort(-1, descending=True)
        probs = sorted_logits.softmax(-1)
        drop = probs.cumsum(-1) - probs >= top_p  # mass before this token already reaches top_p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits.log_softmax(-1)


def _stop_cut(text: str, stop: Sequence[str]) -> int | None:
    cuts = [i for i in (text.find(s) for s in stop) if i >= 0]
    return min(cuts) if cuts else None


def generate(model, prompt: str, *, hooks=(), max_new_tokens: int = 64, temperature: float = 0.0,
             top_p: float = 1.0, top_k: int = 0, stop: Sequence[str] = (), chat: bool = False,
             seed: int = 0, n: int = 1, parse_special: bool = False) -> list[dict]:
    """``n`` continuations of ``prompt`` with ``hooks`` active at every step, decoded with a KV cache.

    ``hooks`` is a list of ``(hook_name, fn)`` or a callable ``(cache, n_prompt) -> list`` for
    hooks that read the cache (``sparse_attention_hooks``). A sample ends at EOS, at the first
    stop string (cut from ``text``, its tokens kept in ``tokens``) or at ``max_new_tokens``.
    Per sample: ``text``, ``tokens``, ``logprob`` (sum of log-probs under the sampling
    distribution: temperature, top-k, top-p applied -- the base sampler of Best-of-N) and
    ``model_logprob`` (under the hooked model at temperature 1), ``stopped`` (eos/stop/length).
    Deterministic by ``seed``; the n samples share one batched cache. The prompt is never cut: a prompt
    plus ``max_new_tokens`` beyond the model's context is refused, saying how many new tokens fit.
    """
    check_sampling(temperature, top_p, top_k, n, max_new_tokens)
    n_ctx = model.cfg.n_ctx
    if max_new_tokens > n_ctx - 1:
        raise WorkbenchError(f"max_new_tokens={max_new_tokens} exceeds what the context of {model.cfg.model_name} "
                             f"allows ({n_ctx} tokens, prompt included): use at most {n_ctx - 1}")
    stop = [stop] if isinstance(stop, str) else [s for s in stop if s]
    ids = prompt_ids(model, prompt, chat, parse_special)
    n_prompt = len(ids)
    if n_prompt + max_new_tokens > n_ctx:
        fit = max(0, n_ctx - n_prompt)
        raise WorkbenchError(f"the prompt is {n_prompt} tokens, so with max_new_tokens={max_new_tokens} it exceeds the "
                             f"context of {model.cfg.model_name} ({n_ctx} tokens): "
                             + (f"at most {fit} new tokens fit" if fit else "shorten the prompt"))
    device = model.cfg.device
    gen = torch.Generator().manual_seed(int(seed))
    eos = model.tokenizer.eos_token_id
    cache = new_cache(model, n)
    fwd_hooks = list(hooks(cache, n_prompt) if callable(hooks) else hooks)

    tokens = [[] for _ in range(n)]
    lp = [0.0] * n
    model_lp = [0.0] * n
    stopped = [None] * n
    texts = [""] * n

    def choose(step: int, logits: torch.Tensor) -> torch.Tensor | None:
        logits = logits.cpu()
        logq = sampling_logprobs(logits, temperature, top_p, top_k)
        nxt = logq.argmax(-1) if temperature == 0 else torch.multinomial(logq.exp(), 1, generator=gen)[:, 0]
        logp = logits.log_softmax(-1)
        for i in range(n):
            if stopped[i]:
                continue
            t = int(nxt[i])
            tokens[i].append(t)
            lp[i] += float(logq[i, t])
            model_lp[i] += float(logp[i, t])
            if t == eos:
                stopped[i] = "eos"
                texts[i] = model.tokenizer.decode(tokens[i][:-1])
                continue
            texts[i] = model.tokenizer.decode(tokens[i])
            cut = _stop_cut(texts[i], stop)
            if cut is not None:
                stopped[i], texts[i] = "stop", texts[i][:cut]
        if all(stopped) or step + 1 == max_new_tokens:
            return None
        return nxt[:, None].to(device)

    decode_loop(model, cache, torch.tensor([ids] * n, device=device), choose, fwd_hooks)
    return [{"text": texts[i], "tokens": tokens[i], "logprob": lp[i], "model_logprob": model_lp[i],
             "stopped": stopped[i] or "length", "n_prompt_tokens": n_prompt} for i in range(n)]


# ----------------------------------------------------------------------------- rewards


def target_logprob_reward(model, target: str, hooks: Sequence[Hook] = (), chat: bool = False) -> Reward:
    """Reward = log p(target | prompt + sample) under ``model`` (a reference model, or the hooked one)."""
    if not isinstance(target, str) or not target:
        raise WorkbenchError("the reward target must be a non-empty string.")
    target_ids = text_ids(model, target)

    def reward(prompt: str, sample: str) -> float:
        ids = prompt_ids(model, prompt, chat) + text_ids(model, sample)
        _check_fits(model, len(ids) + len(target_ids), "prompt + sample + reward target")
        x = torch.tensor([ids + target_ids], device=model.cfg.device)
        with torch.inference_mode(), model.hooks(fwd_hooks=list(hooks)):
            logp = model(x)[0, len(ids) - 1 : -1].float().log_softmax(-1)
        return float(logp.gather(-1, torch.tensor(target_ids, device=logp.device)[:, None]).sum())

    return reward


def probe_reward(model, site: str, direction, chat: bool = False, positions: str = "mean") -> Reward:
    """Reward = projection of the activation at ``site`` on a (unit-normalised) linear direction.

    ``positions``: ``"mean"`` over the sample's tokens or ``"last"`` token. The probe of the
    probe issue is a direction at a residual site, so this is its score up to a bias.
    """
    from workbench.capture import check_sites

    check_sites(model, [site])
    if positions not in ("mean", "last"):
        raise WorkbenchError(f"positions={positions!r}: choose 'mean' or 'last'.")
    d = torch.nn.functional.normalize(torch.as_tensor(direction, dtype=torch.float32).flatten(), dim=0)

    def reward(prompt: str, sample: str) -> float:
        ids = prompt_ids(model, prompt, chat)
        sample_ids = text_ids(model, sample)
        _check_fits(model, len(ids) + len(sample_ids), "prompt + sample")
        x = torch.tensor([ids + sample_ids], device=model.cfg.device)
        with torch.inference_mode():
            _, cache = model.run_with_cache(x, names_filter=[site])
        act = cache[site][0].float().cpu()
        act = act[len(ids):] if sample_ids else act[-1:]
        if act.shape[-1] != d.shape[0]:
            raise WorkbenchError(f"probe direction has {d.shape[0]} dims but {site} has {act.shape[-1]}.")
        proj = act @ d
        return float(proj.mean() if positions == "mean" else proj[-1])

    return reward


def detector_reward(model, detector: dict) -> Reward:
    """Reward = injection probability of prompt + sample under a trained detector (``detect.score_prompts``):
    one pooled forward per sample, nothing written. Negate it (``lambda p, s: -r(p, s)``) to select samples that
    look least like an injection."""
    from workbench.detect import check_detector, score_prompts

    check_detector(model, detector)

    def reward(prompt: str, sample: str) -> float:
        return float(score_prompts(model, detector, [{"text": prompt + sample}], chat=False, progress=False)[0])

    return reward


def score(reward: Reward, prompt: str, samples: Sequence[dict]) -> list[float]:
    """Rewards of the samples; NaN, inf or a non-number is an error, not a silent argmax."""
    out = []
    for s in samples:
        r = reward(prompt, s["text"])
        try:
            r = float(r)
        except (TypeError, ValueError):
            raise WorkbenchError(f"reward returned {r!r}: it must return a float.") from None
        if not math.isfinite(r):
            raise WorkbenchError(f"reward returned {r} for sample {s['text'][:40]!r}: it must be finite "
                                 "(fix the reward function).")
        out.append(r)
    return out


# ----------------------------------------------------------------------------- selection


def _check_lam(lam: float) -> None:
    if not lam >= 0:
        raise WorkbenchError(f"lambda={lam} must be >= 0 (0 is hard Best-of-N, inf a random sample).")


def selection_probs(rewards: Sequence[float], lam: float) -> torch.Tensor:
    """``softmax(r / λ)``; λ = 0 splits the mass over the argmax ties, λ = inf is uniform."""
    _check_lam(lam)
    r = torch.tensor(rewards, dtype=torch.float64)
    if math.isinf(lam) or bool((r == r[0]).all()):
        return torch.full_like(r, 1 / len(r))
    if lam == 0:
        top = (r == r.max()).double()
        return top / top.sum()
    return (r / lam).softmax(0)


def kl_bound(n: int, lam: float, reward_range: float = 1.0) -> float:
    """``log(N / (1 + (N - 1) e^{-D/λ}))``: the Soft BoN KL bound for rewards spanning an interval of width D.

    The paper states it for D = 1 (rewards in [0, 1]); it is ``log`` of the largest possible
    density ratio (one sample at the top reward, N - 1 at the bottom), so rescaling r is rescaling β.
    """
    _check_lam(lam)
    if n < 1:
        raise WorkbenchError(f"n={n} must be >= 1.")
    if lam == 0:
        return math.log(n)
    if math.isinf(lam) or reward_range == 0:
        return 0.0
    return math.log(n) - math.log1p((n - 1) * math.exp(-reward_range / lam))


def selection_kl(probs: torch.Tensor) -> float:
    """KL(selection || uniform) over one candidate pool, in nats.

    Why this estimate: the base sampler is "a uniformly chosen candidate of an i.i.d. pool",
    so KL(selected || base) over texts <= E_pool KL(p_pool || uniform) (data processing: the
    text is a function of (pool, index)). It is exact given the pool, needs no enumeration of
    the text space, never underestimates, and for any pool it is <= ``kl_bound`` with the
    pool's reward range (entropy >= min-entropy).
    """
    p = probs[probs > 0]
    return float(math.log(len(probs)) + (p * p.log()).sum())


def soft_best_of_n(model, prompt: str, reward: Reward, n: int = 8, lam: float = 1.0, *, seed: int = 0,
                   **generate_kwargs) -> dict:
    """Draw ``n`` samples, choose one with probability ∝ exp(r / λ) (seeded), and say what it cost.

    ``reward_gain`` is the expected reward of the selection minus that of a random sample
    (exact over the pool); ``chosen_gain`` is the realised one. ``kl_bound`` is the paper's
    bound (rewards in [0, 1]); ``kl_bound_range`` uses the pool's observed reward range and
    always bounds ``kl_empirical`` (``selection_kl``).
    """
    _check_lam(lam)
    temperature = generate_kwargs.pop("temperature", 1.0)
    if temperature == 0 and n > 1:
        raise WorkbenchError("best-of-N with temperature 0 draws N identical samples: use temperature > 0.")
    samples = generate(model, prompt, n=n, seed=seed, temperature=temperature, **generate_kwargs)
    rewards = score(reward, prompt, samples)
    probs = selection_probs(rewards, lam)
    chosen = int(torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(int(seed) + 1)))
    r = torch.tensor(rewards, dtype=torch.float64)
    mean = float(r.mean())
    for s, ri, pi in zip(samples, rewards, probs.tolist(), strict=True):
        s["reward"], s["p_select"] = ri, pi
    return {
        "chosen": chosen, "sample": samples[chosen], "samples": samples, "rewards": rewards,
        "lambda": lam, "n": n,
        "mean_reward": mean, "chosen_reward": rewards[chosen],
        "reward_gain": float((probs * r).sum()) - mean, "chosen_gain": rewards[chosen] - mean,
        "kl_bound": kl_bound(n, lam), "kl_bound_range": kl_bound(n, lam, float(r.max() - r.min())),
        "kl_empirical": selection_kl(probs),
    }


def best_of_n(model, prompt: str, reward: Reward, n: int = 8, *, seed: int = 0, **generate_kwargs) -> dict:
    """Hard Best-of-N: the argmax-reward sample of ``n`` (first on ties); KL bound log N."""
    out = soft_best_of_n(model, prompt, reward, n, 0.0, seed=seed, **generate_kwargs)
    out["chosen"] = int(torch.tensor(out["rewards"]).argmax())
    out["sample"] = out["samples"][out["chosen"]]
    out["chosen_reward"] = out["rewards"][out["chosen"]]
    out["chosen_gain"] = out["chosen_reward"] - out["mean_reward"]
    return out


# ----------------------------------------------------------------------------- CLI entry


_STEER_USAGE = {"neuron": "neuron:LAYER:INDEX:SCALE", "feature": "feature:SAE:INDEX:SCALE",
                "quant": "quant:stampBITS, e.g. quant:stamp4"}


def parse_steer(spec: str | None) -> list[tuple]:
    """The parts of a ``--steer`` spec, checked before any model loads: ``("neuron", layer, idx, scale)``,
    ``("feature", sae, idx, scale)`` or ``("quant", bits)``."""
    from workbench.tools.quant import check_bits

    if not spec:
        return []
    parts = []
    for part in spec.split(","):
        part = part.strip()
        kind, _, rest = part.partition(":")
        if kind not in _STEER_USAGE or (kind == "quant" and not rest.startswith("stamp")):
            raise WorkbenchError(f"steer spec {part!r}: use {', '.join(_STEER_USAGE.values())}; join several with ','.")
        try:
            if kind == "quant":
                parts.append(("quant", int(rest[len("stamp"):] or 4)))
                check_bits(parts[-1][1])
                continue
            head, idx, scale = rest.split(":") if kind == "neuron" else rest.rsplit(":", 2)
            parts.append((kind, int(head) if kind == "neuron" else head, int(idx), float(scale)))
        except ValueError:
            raise WorkbenchError(f"steer spec {part!r}: expected {_STEER_USAGE[kind]}.") from None
        if (kind == "feature" and not head) or parts[-1][2] < 0 or not math.isfinite(parts[-1][3]):
            raise WorkbenchError(f"steer spec {part!r}: expected {_STEER_USAGE[kind]} with a name, an index >= 0 "
                                 "and a finite scale.")
    return parts


def steer_hooks(model, spec: str | None) -> list[Hook]:
    """Hooks from a CLI spec: ``neuron:L:idx:scale`` (multiply MLP neuron idx at layer L by scale),
    ``feature:SAE:idx:scale`` (add scale x the unit decoder direction of a trained SAE's feature idx at
    its site), ``quant:stamp4`` / ``quant:stampB`` (STaMP activations at B bits), several joined by ``,``."""
    hooks: list[Hook] = []
    for kind, *args in parse_steer(spec):
        if kind == "neuron":
            from workbench.sae.interventions import neuron_hook

            layer, idx, scale = args
            if not 0 <= layer < model.cfg.n_layers or not 0 <= idx < model.cfg.d_mlp:
                raise WorkbenchError(f"steer spec neuron:{layer}:{idx}:{scale}: layer must be < {model.cfg.n_layers} "
                                     f"and index < {model.cfg.d_mlp}.")
            hooks.append((f"blocks.{layer}.mlp.hook_post", neuron_hook([idx], scale - 1)))
        elif kind == "feature":
            from workbench.sae.interventions import intervention
            from workbench.sae.load import load_sae

            name, idx, scale = args
            hooks += intervention(model, load_sae(name, model=model), "feature", idx, scale)[0]
        else:
            from workbench.tools.quant import stamp_hooks

            hooks += stamp_hooks(model, bits=args[0], sink_tokens=1)
    return hooks


def parse_reward(spec: str | None) -> str | None:
    """The target text of a ``--reward target:TEXT`` spec (None without one), checked before any model loads."""
    if spec is None:
        return None
    kind, _, target = spec.partition(":")
    if kind.strip() != "target" or not target.strip():
        raise WorkbenchError(f"reward {spec!r}: use target:TEXT (log-probability of a non-empty TEXT after the sample).")
    return target
