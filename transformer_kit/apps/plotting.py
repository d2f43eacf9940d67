"""PNG heat maps: positional encodings (position down, dimension across, as the paper's
sinusoidal table is usually drawn) and the attention weights of a model for an input, one
figure per layer with a panel per head."""

from __future__ import annotations

import math
from contextlib import contextmanager
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display needed

import matplotlib.pyplot as plt
import torch
from torch import Tensor

from transformer_kit.core.attention import MultiHeadAttention
from transformer_kit.core.errors import InputError
from transformer_kit.core.masks import masked_softmax
from transformer_kit.core.registry import get_registry


def positional_matrix(name: str, length: int, d_model: int, **params) -> tuple[Tensor, str]:
    """What the encoding adds or applies, as a 2-D matrix (length, d_model or length), and a
    description of its axes. Raises :class:`InputError` for sizes below 1 (2 for d_model)."""
    for label, value, least in (("length", length, 1), ("d_model", d_model, 2)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise InputError(f"{label} must be an integer >= {least}, got {value!r}.")
    context = {"d_model": d_model, "max_len": length, "head_dim": d_model, "num_heads": 1}
    enc = get_registry().create("positional", name, context=context, **params)
    positions = torch.arange(length)[None]
    with torch.no_grad():
        bias = enc.score_bias(positions, positions)
        if bias is not None:
            return bias[0, 0], "key position"
        added = enc.embed(torch.zeros(1, length, d_model), positions)[0]
        if added.abs().sum() > 0:
            return added, "dimension"
        rotated = enc.rotate(torch.ones(1, 1, length, d_model), positions)[0, 0]
        return rotated, "dimension (rotation of a ones vector)"


def plot_positional(path: str | Path, name: str = "sinusoidal", length: int = 50,
                    d_model: int = 128, **params) -> Path:
    """Heat map of a positional encoding: position down, dimension (or key) across."""
    matrix, x_label = positional_matrix(name, length, d_model, **params)
    fig, ax = plt.subplots(figsize=(10, 5))
    image = ax.pcolormesh(matrix.numpy(), cmap="RdBu", shading="auto")
    ax.set_title(f"{name} positional encoding: {length} positions x {matrix.shape[1]} "
                 f"{'keys' if x_label == 'key position' else 'dimensions'}")
    ax.set_xlabel(x_label)
    ax.set_ylabel("position")
    ax.invert_yaxis()
    fig.colorbar(image, ax=ax)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


@contextmanager
def capture_attention(model):
    """Record every attention call's weights (batch, heads, q_len, k_len) while inside.

    Yields a list of (module name, weights); kernels with a ``weights`` method report their own,
    others the standard softmax(q k^T * scale + bias) over the same mask.
    """
    records: list[tuple[str, Tensor]] = []
    patched = []
    for name, module in model.named_modules():
        if isinstance(module, MultiHeadAttention):
            kernel = module.kernel

            def forward(q, k, v, mask=None, bias=None, *, _kernel=kernel, _name=name,
                        _forward=kernel.forward):
                if hasattr(_kernel, "weights"):
                    weights = _kernel.weights(q, k, mask, bias)
                else:
                    scale = getattr(_kernel, "scale", None) or 1 / math.sqrt(q.shape[-1])
                    weights = masked_softmax((q.float() @ k.float().transpose(-2, -1)) * scale,
                                             mask, bias)
                records.append((_name, weights.detach()))
                return _forward(q, k, v, mask=mask, bias=bias) if bias is not None else _forward(
                    q, k, v, mask=mask)

            kernel.forward = forward
            patched.append(kernel)
    try:
        yield records
    finally:
        for kernel in patched:
            del kernel.forward


def plot_attention(model, inputs: tuple[Tensor, ...], out_dir: str | Path, row: int = 0) -> list[Path]:
    """One PNG per attention module (layer): a panel per head, queries down, keys across."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.eval()
    with torch.no_grad(), capture_attention(model) as records:
        model(*inputs)
    paths = []
    for name, weights in records:
        heads = weights.shape[1]
        cols = min(heads, 4)
        rows = math.ceil(heads / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(3 * cols, 3 * rows), squeeze=False)
        for h in range(rows * cols):
            ax = axes[h // cols][h % cols]
            if h >= heads:
                ax.axis("off")
                continue
            ax.imshow(weights[row, h].numpy(), cmap="viridis", vmin=0, vmax=1)
            ax.set_title(f"head {h}")
            ax.set_xlabel("key")
            ax.set_ylabel("query")
        fig.suptitle(f"attention weights: {name} (row {row})")
        path = out_dir / f"{name.replace('.', '_')}.png"
        fig.savefig(path, dpi=80, bbox_inches="tight")
        plt.close(fig)
        paths.append(path)
    return paths
