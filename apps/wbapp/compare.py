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
    """Next-token probabilities before/after, the SAE module's shift metrics, and greedy continuations."""

    tokens: list[str]  # union of both top-k lists, by probability before
    p_before: list[float]
    p_after: list[float]
    metrics: dict  # workbench.sae.interventions.next_token_metrics: kl = KL(after || before), overlaps, ...
    top1_before: str
    top1_after: str
    continuation_before: str
    continuation_after: str

    @property
    def kl(self) -> float:
        return self.metrics["kl"]


def _continue(model, text: str, hooks, n: int) -> str:
    """Greedy continuation with the hooks active at every step (the workbench's KV-cached generation)."""
    if n <= 0:
        return ""
    from workbench.tools.generate import generate

    return generate(model, text, hooks=list(hooks), max_new_tokens=n)[0]["text"]


def next_token_shift(model, text: str, changed_text: str | None = None, fwd_hooks=(),
                     change: Callable[[], contextlib.AbstractContextManager] | None = None, target_tokens=(),
                     k: int = 10, new_tokens: int = 20) -> Shift:
    """``text`` on the unchanged model vs ``changed_text`` (default: the same) with ``fwd_hooks`` inside ``change()``.

    The distributions and metrics come from the SAE module's intervention code, so the playground, the
    CLI and the studies measure a shift the same way.
    """
    from workbench.sae.interventions import next_token_metrics, next_token_probs

    changed_text = text if changed_text is None else changed_text
    if not text.strip():
        raise WorkbenchError("type a prompt first")
    before = next_token_probs(model, [text])[0]
    cont_before = _continue(model, text, (), new_tokens)
    with (change or contextlib.nullcontext)():
        after = next_token_probs(model, [changed_text], list(fwd_hooks))[0]
        cont_after = _continue(model, changed_text, fwd_hooks, new_tokens)
    metrics = next_token_metrics(before.numpy(), after.numpy(), target_tokens, k=k)
    top = torch.cat([before.topk(k).indices, after.topk(k).indices]).unique()
    top = top[before[top].argsort(descending=True)]
    names = [_show(model, t) for t in top]
    names = [n if names.count(n) == 1 else f"{n} #{int(t)}" for n, t in zip(names, top, strict=True)]
    return Shift(tokens=names, p_before=before[top].tolist(), p_after=after[top].tolist(), metrics=metrics,
                 top1_before=_show(model, before.argmax()), top1_after=_show(model, after.argmax()),
                 continuation_before=cont_before, continuation_after=cont_after)


def _show(model, token: torch.Tensor) -> str:
    """A token as visible text (whitespace and newlines escaped), so bars stay distinguishable."""
    return repr(model.to_string(token.reshape(1)))[1:-1] or "(empty)"


def check_neurons(model, layer: int, neurons: list[int]) -> str:
    """The ``mlp.hook_post`` site of ``layer``, after checking the layer and neuron indices."""
    if not 0 <= layer < model.cfg.n_layers:
        raise WorkbenchError(f"layer {layer} is out of range: the model has layers 0..{model.cfg.n_layers - 1}")
    bad = [n for n in neurons if not 0 <= n < model.cfg.d_mlp]
    if bad or not neurons:
        raise WorkbenchError(f"neurons must be integers in 0..{model.cfg.d_mlp - 1} (got {bad or 'none'})")
    return f"blocks.{layer}.mlp.hook_post"


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
    fig.update_layout(title=f"{title} (KL after||before = {shift.kl:.4f} nats)", barmode="group",
                      yaxis_title="probability", template="plotly_white", height=420)
    return fig
