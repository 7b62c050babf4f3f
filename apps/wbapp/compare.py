"""Next-token distribution before and after a change to the model or its prompt.

One measurement for every live comparison in the app (playground loci, a quantization setting):
the change is a prompt prefix and/or a context manager that installs hooks on the model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from workbench.errors import WorkbenchError


@dataclass
class Shift:
    """Next-token probabilities before/after, their KL, and greedy continuations."""

    tokens: list[str]  # union of both top-k lists, by probability before
    p_before: list[float]
    p_after: list[float]
    kl: float  # KL(before || after) of the full next-token distribution, in nats
    top1_before: str
    top1_after: str
    continuation_before: str
    continuation_after: str


def _next_token_logprobs(model, text: str) -> torch.Tensor:
    tokens = model.to_tokens(text)
    if tokens.shape[1] > model.cfg.n_ctx:
        raise WorkbenchError(f"the prompt has {tokens.shape[1]} tokens, more than the model's {model.cfg.n_ctx}")
    with torch.no_grad():
        return model(tokens)[0, -1].float().log_softmax(-1)


def _continue(model, text: str, n: int) -> str:
    if n <= 0:
        return ""
    with torch.no_grad():
        out = model.generate(model.to_tokens(text), max_new_tokens=n, do_sample=False, verbose=False,
                             stop_at_eos=True)
    prompt_len = model.to_tokens(text).shape[1]
    return model.to_string(out[0, prompt_len:])


def next_token_shift(model, text: str, change: Callable[[], contextlib.AbstractContextManager] | None = None,
                     changed_text: str | None = None, k: int = 10, new_tokens: int = 20) -> Shift:
    """Compare ``text`` on the unchanged model with ``changed_text`` (default: the same) under ``change()``."""
    changed_text = text if changed_text is None else changed_text
    change = change or contextlib.nullcontext
    before = _next_token_logprobs(model, text)
    cont_before = _continue(model, text, new_tokens)
    with change():
        after = _next_token_logprobs(model, changed_text)
        cont_after = _continue(model, changed_text, new_tokens)
    kl = float((before.exp() * (before - after)).sum())
    top = torch.cat([before.topk(k).indices, after.topk(k).indices]).unique()
    top = top[before[top].argsort(descending=True)]
    names = [_show(model, t) for t in top]
    names = [n if names.count(n) == 1 else f"{n} #{int(t)}" for n, t in zip(names, top, strict=True)]
    return Shift(tokens=names, p_before=before[top].exp().tolist(),
                 p_after=after[top].exp().tolist(), kl=kl, top1_before=_show(model, before.argmax()),
                 top1_after=_show(model, after.argmax()), continuation_before=cont_before,
                 continuation_after=cont_after)


def _show(model, token: torch.Tensor) -> str:
    """A token as visible text (whitespace and newlines escaped), so bars stay distinguishable."""
    return repr(model.to_string(token.reshape(1)))[1:-1] or "(empty)"


def neuron_scaling(model, layer: int, neurons: list[int], scale: float) -> Callable[[], contextlib.AbstractContextManager]:
    """Checked now, applied later: a factory of hook contexts that multiply MLP neurons of ``blocks.{L}.mlp.hook_post``."""
    if not 0 <= layer < model.cfg.n_layers:
        raise WorkbenchError(f"layer {layer} is out of range: the model has layers 0..{model.cfg.n_layers - 1}")
    bad = [n for n in neurons if not 0 <= n < model.cfg.d_mlp]
    if bad or not neurons:
        raise WorkbenchError(f"neurons must be integers in 0..{model.cfg.d_mlp - 1} (got {bad or 'none'})")
    index = torch.tensor(neurons)

    def hook(act, hook):
        act[..., index] = act[..., index] * scale
        return act

    return lambda: model.hooks(fwd_hooks=[(f"blocks.{layer}.mlp.hook_post", hook)])


def parse_ints(text: str, what: str) -> list[int]:
    """``"3, 17,42"`` -> ``[3, 17, 42]``, with a one-line error otherwise."""
    try:
        return [int(x) for x in text.replace(",", " ").split()]
    except ValueError:
        raise WorkbenchError(f"{what} must be integers separated by commas, e.g. 3, 17, 42") from None


def shift_figure(shift: Shift, title: str = "next-token distribution"):
    """Grouped bars: probability of each top token before and after."""
    import plotly.graph_objects as go

    fig = go.Figure([go.Bar(name="before", x=shift.tokens, y=shift.p_before, marker_color="#1f77b4"),
                     go.Bar(name="after", x=shift.tokens, y=shift.p_after, marker_color="#d62728")])
    fig.update_layout(title=f"{title} (KL before||after = {shift.kl:.4f} nats)", barmode="group",
                      yaxis_title="probability", template="plotly_white", height=420)
    return fig
