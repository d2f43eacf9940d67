"""LoRA adapters saved by PEFT (``adapter_config.json`` + ``adapter_model.safetensors``), merged
into a Hugging Face checkpoint's weights before its family maps them onto the kit's parameters.

    model = tk.from_hf("base-folder", adapter="adapter-folder")

Each adapted linear layer ``W`` (out_features, in_features) becomes ``W + scale * B @ A`` with
``A`` (r, in_features) and ``B`` (out_features, r) the adapter's ``lora_A`` and ``lora_B``, and
``scale = lora_alpha / r`` (``lora_alpha / sqrt(r)`` with ``use_rslora``; ``rank_pattern`` and
``alpha_pattern`` give a layer its own ``r`` and ``lora_alpha`` as PEFT matches them), as PEFT's
``merge_and_unload`` computes it; ``fan_in_fan_out`` layers (GPT-2's ``Conv1D``, stored
(in_features, out_features)) get the transposed product. The merge happens on the checkpoint's
own tensor names, so whatever a family does with a weight afterwards (GPT-2's fused ``c_attn``
split into q, k, v; a transposition) applies to the merged weight as it does to the base one.

Variants whose effect is not a low-rank sum on a linear layer's weight are refused with a
:class:`~transformer_kit.core.errors.CheckpointError` naming the field: DoRA (``use_dora``),
``bias`` other than ``"none"``, ``lora_bias``, ``modules_to_save``, trainable tokens, adapted
embeddings or convolutions, parameter targets, and any other option set that the kit does not
know; never merged approximately.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from transformer_kit.checkpoints.deferred import DeferredTensor, SharedRead, materialize
from transformer_kit.core.config_files import read_json_object
from transformer_kit.core.errors import CheckpointError, missing_path

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
#: The prefix PEFT's saved names carry before the base model's module names.
PEFT_PREFIX = "base_model.model."
#: Options that choose which modules are adapted (the saved weights say which were) or only
#: describe the adapter or its training: they do not change what a merge computes.
_DESCRIPTIVE = frozenset({
    "peft_type", "task_type", "base_model_name_or_path", "revision", "inference_mode",
    "auto_mapping", "peft_version", "target_modules", "exclude_modules", "layers_to_transform",
    "layers_pattern", "lora_dropout", "init_lora_weights", "loftq_config", "eva_config",
    "lora_ga_config", "megatron_config", "megatron_core", "ensure_weight_tying", "qalora_group_size",
})
#: Options the merge reads.
_READ = frozenset({"r", "lora_alpha", "use_rslora", "fan_in_fan_out", "bias", "rank_pattern",
                   "alpha_pattern"})
#: ``init_lora_weights`` values that also change the base weights when the adapter is made: its
#: weights are relative to that changed base unless PEFT converted them on saving.
_BASE_CHANGING_INITS = ("pissa", "olora", "corda")


@dataclass(frozen=True)
class LoraLayer:
    """One adapted linear layer: ``weight`` the base checkpoint's tensor name, ``a`` (r,
    in_features), ``b`` (out_features, r), ``scale`` the factor of ``b @ a``."""

    weight: str
    a: Tensor
    b: Tensor
    scale: float

    def delta(self, fan_in_fan_out: bool) -> Tensor:
        """``scale * b @ a``: (out_features, in_features), transposed with ``fan_in_fan_out``."""
        delta = (self.b @ self.a) * self.scale
        return delta.T if fan_in_fan_out else delta


@dataclass(frozen=True)
class LoraAdapter:
    """A PEFT LoRA adapter read from ``folder``: its layers, by the base module they adapt."""

    folder: str
    layers: dict[str, LoraLayer]
    fan_in_fan_out: bool


def _refuse(folder: Path, field: str, value: Any, why: str) -> CheckpointError:
    return CheckpointError(f"LoRA adapter {str(folder)!r}: {field}={value!r} is not supported; {why}")


def _set(value: Any) -> bool:
    return value not in (None, False, 0, "", [], {})


def _check_options(folder: Path, config: dict[str, Any]) -> None:
    """Refuse an adapter whose config asks for anything but a plain low-rank sum."""
    if config.get("peft_type") != "LORA":
        raise _refuse(folder, "peft_type", config.get("peft_type"),
                      "the kit merges LoRA adapters (peft_type 'LORA') only.")
    if config.get("bias", "none") != "none":
        raise _refuse(folder, "bias", config["bias"], "the kit merges adapters trained with "
                      "bias='none' (biases that the adapter changes are not merged).")
    init = config.get("init_lora_weights")
    if isinstance(init, str) and init.lower().startswith(_BASE_CHANGING_INITS):
        raise _refuse(folder, "init_lora_weights", init, "such an initialization changes the base "
                      "weights too; save the adapter with PEFT's "
                      "path_initial_model_for_weight_conversion so it applies to the original base.")
    for field, value in sorted(config.items()):
        if field not in _DESCRIPTIVE and field not in _READ and _set(value):
            raise _refuse(folder, field, value, "the kit merges plain LoRA (W + scale * B @ A on "
                          "linear layers) only. Train the adapter without it, or merge it with "
                          "PEFT's merge_and_unload and load the merged checkpoint.")
    for field in ("r", "lora_alpha"):
        value = config.get(field)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise _refuse(folder, field, value, "it must be a positive number.")


def _pattern_value(patterns: Any, module: str, default: float, field: str, folder: Path) -> float:
    """PEFT's per-module value: the first key of ``patterns`` matching the end of ``module``."""
    if not isinstance(patterns, dict):
        raise _refuse(folder, field, patterns, "it must map module name patterns to numbers.")
    for key, value in patterns.items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


def _pairs(folder: Path, tensors: dict[str, Tensor]) -> Iterator[tuple[str, Tensor, Tensor]]:
    """(module, lora_A, lora_B) of each adapted module, every other tensor refused."""
    modules: dict[str, dict[str, Tensor]] = {}
    # the names that tell why first: an adapted embedding's folder also holds its base weights
    for name, tensor in sorted(tensors.items(), key=lambda item: ".lora_" not in item[0]):
        module, _, kind = name.removeprefix(PEFT_PREFIX).rpartition(".lora_")
        if kind not in ("A.weight", "B.weight"):
            what = ("an adapted embedding" if ".lora_embedding_" in name else
                    "a base layer's own weights (PEFT's save_embedding_layers, for a resized "
                    "vocabulary; save with save_embedding_layers=False to merge onto the base "
                    "checkpoint's)" if name.endswith(".base_layer.weight") else
                    "a bias the adapter trains (lora_bias)" if kind in ("A.bias", "B.bias") else
                    "DoRA's magnitude (use_dora)" if "lora_magnitude_vector" in name else
                    "a tensor that is not lora_A or lora_B")
            raise CheckpointError(f"LoRA adapter {str(folder)!r} holds {name!r}, {what}; the kit "
                                  "merges lora_A and lora_B of linear layers only.")
        modules.setdefault(module, {})[kind[0]] = tensor
    for module, pair in sorted(modules.items()):
        if set(pair) != {"A", "B"}:
            raise CheckpointError(f"LoRA adapter {str(folder)!r} has lora_{set('AB') - set(pair)} "
                                  f"missing for {module!r}; save the adapter again with PEFT.")
        if pair["A"].dim() != 2 or pair["B"].dim() != 2:
            raise CheckpointError(f"LoRA adapter {str(folder)!r} adapts {module!r} with "
                                  f"{pair['A'].dim()}-dimensional lora_A (a convolution); the kit "
                                  "merges linear layers only (target_modules).")
        yield module, pair["A"].float(), pair["B"].float()


def read_adapter(folder: str | Path) -> LoraAdapter:
    """The PEFT LoRA adapter saved in ``folder`` (every option checked, see the module)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(missing_path(folder, "a PEFT adapter folder (adapter_config.json and "
                                           "adapter_model.safetensors)") if not folder.exists() else
                              f"{str(folder)!r} is a file; give a PEFT adapter folder.")
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (folder / name).is_file():
            hint = (" It holds adapter_model.bin: save it with safe_serialization=True."
                    if (folder / "adapter_model.bin").is_file() else "")
            raise CheckpointError(f"{str(folder)!r} is not a PEFT adapter folder: {name} is "
                                  f"missing.{hint}")
    config = read_json_object(folder / CONFIG_FILE, CheckpointError, "Save the adapter again with PEFT.")
    _check_options(folder, config)
    try:
        tensors = load_file(str(folder / WEIGHTS_FILE))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"Cannot read {str(folder / WEIGHTS_FILE)!r}: {exc}") from None
    if not tensors:
        raise CheckpointError(f"LoRA adapter {str(folder)!r} holds no tensors.")
    layers = {}
    for module, a, b in _pairs(folder, tensors):
        rank = _pattern_value(config.get("rank_pattern") or {}, module, config["r"], "rank_pattern", folder)
        alpha = _pattern_value(config.get("alpha_pattern") or {}, module, config["lora_alpha"],
                               "alpha_pattern", folder)
        if a.shape[0] != rank or b.shape[1] != rank:
            raise CheckpointError(f"LoRA adapter {str(folder)!r}: {module!r} has lora_A "
                                  f"{tuple(a.shape)} and lora_B {tuple(b.shape)}, not rank {rank} "
                                  "as adapter_config.json says. Save the adapter again with PEFT.")
        scale = alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)
        layers[module] = LoraLayer(f"{module}.weight", a, b, float(scale))
    return LoraAdapter(str(folder), layers, bool(config.get("fan_in_fan_out")))


def _merged(args: tuple[Tensor, LoraLayer, bool]) -> Tensor:
    weight, layer, fan_in_fan_out = args
    return materialize(weight).float() + layer.delta(fan_in_fan_out)


def _itself(tensor: Tensor) -> Tensor:
    return tensor


def _deferred(tensor: Tensor) -> DeferredTensor:
    """A tensor already read as a :class:`DeferredTensor` (so a family's mapping can combine it
    with the merged ones, which are deferred)."""
    return DeferredTensor(torch.empty_like(tensor, device="meta"), ("read", _itself, tensor))


def merge_adapter(tensors: dict[str, Tensor], adapter: LoraAdapter) -> dict[str, Tensor]:
    """The checkpoint's ``tensors`` (by Hugging Face name) with each adapted weight merged. The
    merged weights are :class:`DeferredTensor` s, computed when they are read (a streamed
    export reads one at a time); a family maps them like any other tensor. Call
    :func:`check_merged_used` on the state dict made from them."""
    merged = {name: t if isinstance(t, DeferredTensor) else _deferred(t) for name, t in tensors.items()}
    for module, layer in adapter.layers.items():
        weight = merged.get(layer.weight)
        if weight is None:
            raise CheckpointError(
                f"LoRA adapter {adapter.folder!r} adapts {module!r}, but the base checkpoint has no "
                f"{layer.weight!r} (target_modules names no linear layer of this model): it is an "
                "adapter for another model.")
        out, inp = layer.b.shape[0], layer.a.shape[1]
        expected = (inp, out) if adapter.fan_in_fan_out else (out, inp)
        if tuple(weight.shape) != expected:
            raise CheckpointError(
                f"LoRA adapter {adapter.folder!r} adapts {module!r} as a {expected} weight "
                f"(fan_in_fan_out={adapter.fan_in_fan_out}); the base checkpoint's is "
                f"{tuple(weight.shape)}: it is an adapter for another model.")
        meta = torch.empty(expected, dtype=torch.float32, device="meta")
        recipe = ("read", _merged, (weight, layer, adapter.fan_in_fan_out))
        merged[layer.weight] = DeferredTensor(meta, recipe)
    return merged


def _sources(value: Any, seen: set[int]) -> Iterator[int]:
    """The ids of every DeferredTensor ``value`` is computed from (itself included)."""
    if isinstance(value, (list, tuple)):
        for item in value:
            yield from _sources(item, seen)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _sources(item, seen)
    elif isinstance(value, DeferredTensor) and id(value) not in seen:
        seen.add(id(value))
        yield id(value)
        recipe = value.recipe
        if recipe[0] == "read":
            owner = getattr(recipe[1], "__self__", None)
            yield from _sources(owner.inputs if isinstance(owner, SharedRead) else (), seen)
        else:
            yield from _sources((recipe[2], recipe[3]), seen)


def check_merged_used(merged: dict[str, Tensor], adapter: LoraAdapter, state: dict[str, Tensor]) -> None:
    """Refuse an adapter whose merged weight the model does not read (a family that takes the
    head from the tied embedding, say): its effect would be lost silently."""
    used = set(_sources(list(state.values()), set()))
    unused = [module for module, layer in adapter.layers.items() if id(merged[layer.weight]) not in used]
    if unused:
        raise CheckpointError(f"LoRA adapter {adapter.folder!r} adapts {unused[:3]}, whose weights "
                              "the kit's model of this checkpoint does not read (a tied or "
                              "unused weight); leave them out of target_modules.")


#: One adapted kit parameter: ``a`` (r, in_features) and ``b`` (out_features, r), the scale in
#: ``b``, so that the parameter's weight plus ``b @ a`` is the merged one.
KitFactors = tuple[Tensor, Tensor]


def _traced(weight: Tensor, axis: int) -> DeferredTensor:
    """A tensor of ``weight``'s shape whose every entry is its index along ``axis`` (exact in
    float32 below 2**24), to see where a family's mapping puts each row and column."""
    index = torch.arange(weight.shape[axis], dtype=torch.float32)
    values = (index[:, None] if axis == 0 else index[None, :]).expand(tuple(weight.shape)).contiguous()
    return _deferred(values)


def _one_axis(index: Tensor, size: int) -> tuple[int, Tensor] | None:
    """(the axis ``index`` varies along, its values along it) when it varies along one only
    and its values are indices below ``size`` (not scaled, not summed)."""
    for axis in (0, 1):
        line = index.select(1 - axis, 0)
        whole = bool((line == line.round()).all() and (line >= 0).all() and (line < size).all())
        if whole and torch.equal(index, line.unsqueeze(1 - axis).expand_as(index)):
            return axis, line.long()
    return None


def kit_factors(adapter: LoraAdapter, tensors: dict[str, Tensor], mapping) -> dict[str, KitFactors]:
    """The adapter as factors of the kit's parameters (by name): ``mapping(tensors)`` is the
    family's state dict of checkpoint ``tensors``. Each adapted weight is replaced by tensors of
    its row and column indices and mapped: a kit parameter whose rows come from the adapted
    weight's rows (or columns) and whose columns from its columns (or rows), one each, takes
    the matching rows of ``b`` and columns of ``a`` (transposed where the roles swap). Anything
    else (a parameter mixing weights, scaled, or not a selection) is refused."""
    rows, cols = dict(tensors), dict(tensors)
    for layer in adapter.layers.values():
        weight = tensors.get(layer.weight)
        if weight is None or weight.dim() != 2:
            raise CheckpointError(f"LoRA adapter {adapter.folder!r} adapts {layer.weight!r}, which "
                                  "the base checkpoint has not as a matrix: an adapter for another model.")
        rows[layer.weight], cols[layer.weight] = _traced(weight, 0), _traced(weight, 1)
    row_state, col_state = mapping(rows), mapping(cols)
    by_id = {id(rows[layer.weight]): module for module, layer in adapter.layers.items()}
    factors: dict[str, KitFactors] = {}
    for name, value in row_state.items():
        sources = [by_id[i] for i in _sources([value], set()) if i in by_id]
        if not sources:
            continue
        module = sources[0]
        layer = adapter.layers[module]
        row_index, col_index = materialize(value), materialize(col_state[name])
        shape = tensors[layer.weight].shape
        two = row_index.dim() == 2 and len(set(sources)) == 1
        found = (_one_axis(row_index, shape[0]), _one_axis(col_index, shape[1])) if two else (None,)
        if None in found or found[0][0] == found[1][0]:
            raise CheckpointError(f"LoRA adapter {adapter.folder!r}: the kit's {name!r} is not a "
                                  f"selection of rows and columns of {sources}, so the adapter "
                                  "cannot stay apart from it; merge it instead (adapter=DIR).")
        # the checkpoint's delta is u @ v: (b, a), or (a.T, b.T) for fan_in_fan_out weights
        u, v = (layer.a.T, layer.b.T) if adapter.fan_in_fan_out else (layer.b, layer.a)
        (row_axis, row_line), (_, col_line) = found
        left, right = u[row_line], v[:, col_line]  # delta[row_line][:, col_line] = left @ right
        b, a = (left, right) if row_axis == 0 else (right.T, left.T)
        factors[name] = (a.contiguous(), (b * layer.scale).contiguous())
    return factors
