"""Where each part of a hooked model lives when one GPU cannot hold it.

TransformerLens runs a model split over ``cfg.n_devices`` GPUs by moving the residual stream to
``get_device_for_block_index(i, cfg)`` before block ``i``: blocks are cut into ``n_devices`` contiguous runs.
``placement`` follows that split (embeddings with the first block, the final norm and unembedding with the last,
where the residual stream arrives), and ``devices_needed`` picks the fewest GPUs on which every run fits, from
the parameters' and buffers' bytes alone, so both are pure functions of shapes: tested on meta-device models
of 8B and 70B shapes without a GPU.
"""

from __future__ import annotations

from workbench.errors import WorkbenchError

RESERVE = 0.15  # of each GPU's free memory, kept for activations, the KV cache and the CUDA context


def module_bytes(model) -> dict:
    """Bytes of the embeddings, of each block and of the final norm + unembedding (parameters and buffers)."""

    def size(module) -> int:
        tensors = [*module.parameters(), *module.buffers()]
        return sum(t.numel() * t.element_size() for t in tensors)

    head = [m for name in ("embed", "pos_embed") if (m := getattr(model, name, None)) is not None]
    tail = [m for name in ("ln_final", "unembed") if (m := getattr(model, name, None)) is not None]
    return {"embed": sum(size(m) for m in head), "blocks": [size(b) for b in model.blocks],
            "final": sum(size(m) for m in tail)}


def block_index(i: int, n_layers: int, n_devices: int) -> int:
    """The device (0-based, from the first one used) of block ``i``: TransformerLens's split."""
    return (i * n_devices) // n_layers


def loads(sizes: dict, n_devices: int) -> list[int]:
    """Bytes each of ``n_devices`` devices holds under the split."""
    out = [0] * n_devices
    blocks = sizes["blocks"]
    out[0] += sizes["embed"]
    for i, b in enumerate(blocks):
        out[block_index(i, len(blocks), n_devices)] += b
    out[block_index(len(blocks) - 1, len(blocks), n_devices)] += sizes["final"]
    return out


def devices_needed(sizes: dict, free: list[int], what: str = "the model", reserve: float = RESERVE) -> int:
    """The fewest of the devices whose free bytes are ``free`` (in order) that hold ``sizes``; else one line."""
    for n in range(1, len(free) + 1):
        if all(load <= room * (1 - reserve) for load, room in zip(loads(sizes, n), free, strict=False)):
            return n
    total = sum(sizes["blocks"]) + sizes["embed"] + sizes["final"]
    raise WorkbenchError(
        f"{what} needs {total / 1e9:.1f} GB, and the {len(free)} GPU(s) here have {sum(free) / 1e9:.1f} GB free "
        f"({reserve:.0%} of each kept for activations): use --dtype bfloat16 (or float16), a machine with more "
        "GPU memory, or --device cpu")


def placement(model, n_devices: int, first: int = 0) -> dict[str, str]:
    """``{module name: device}`` for ``model`` split over ``cuda:first`` .. ``cuda:first + n_devices - 1``."""
    n_layers = len(model.blocks)

    def device(i: int) -> str:
        return f"cuda:{first + block_index(i, n_layers, n_devices)}"

    plan = {name: device(0) for name in ("embed", "hook_embed", "pos_embed", "hook_pos_embed")
            if getattr(model, name, None) is not None}
    plan.update({f"blocks.{i}": device(i) for i in range(n_layers)})
    plan.update({name: device(n_layers - 1) for name in ("ln_final", "unembed") if getattr(model, name, None)
                 is not None})
    return plan


def place(model, n_devices: int, first: int = 0):
    """Move ``model`` onto ``n_devices`` GPUs (``placement``) and tell TransformerLens about the split."""
    for name, device in placement(model, n_devices, first).items():
        model.get_submodule(name).to(device)
    model.cfg.n_devices = n_devices
    model.cfg.device = f"cuda:{first}"
    return model


def free_gpu_bytes(first: int = 0) -> list[int]:
    """Free bytes of ``cuda:first`` and every GPU after it."""
    import torch

    return [torch.cuda.mem_get_info(i)[0] for i in range(first, torch.cuda.device_count())]
