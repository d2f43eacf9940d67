"""``from_hf``: a Hugging Face checkpoint (a local folder, or a Hub name resolved to its cached
snapshot) as an assembled model, through the checkpoint family a plugin registered for its
``model_type``."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from transformer_kit.checkpoints.deferred import materialize, open_checkpoint_tensors
from transformer_kit.checkpoints.end_ids import end_ids
from transformer_kit.checkpoints.hub import checkpoint_folder
from transformer_kit.checkpoints.lora import check_merged_used, kit_factors, merge_adapter, read_adapter
from transformer_kit.checkpoints.reader import Weights, read_hf_config, read_hf_weights
from transformer_kit.checkpoints.sentence_transformers import SentencePipeline, read_sentence_pipeline
from transformer_kit.checkpoints.streaming import StreamedWeights, guard_streamed
from transformer_kit.core.assembly import build_model
from transformer_kit.core.component import CheckpointFamily
from transformer_kit.core.config import ModelConfig, config_from_dict
from transformer_kit.core.config_files import read_json_object
from transformer_kit.core.decoding.defaults import read_defaults
from transformer_kit.core.errors import CheckpointError, InputError
from transformer_kit.core.model import TransformerModel
from transformer_kit.core.registry import get_registry
from transformer_kit.core.registry_entries import RegisteredFamily
from transformer_kit.tokenizer import TextTokenizer

SPECIAL_IDS = ("pad_id", "bos_id", "eos_id")
_PACKAGE = str(Path(__file__).resolve().parents[1])


def _caller_level() -> int:
    """The stack level of the first frame outside transformer_kit, for warnings."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


def checkpoint_family(hf: dict, folder: str | Path) -> RegisteredFamily:
    """The registered family of config dict ``hf``'s ``model_type`` (refused naming ``folder``
    and the model types there are)."""
    try:
        return get_registry().family(hf.get("model_type"))
    except CheckpointError as exc:
        raise CheckpointError(f"Checkpoint {str(folder)!r}: {exc}") from None


def _drop_ids_outside_vocabulary(data: dict, model_type: str, overrides: dict[str, Any]) -> None:
    """Special ids that config.json sets beyond the vocabulary name no token, so no token can
    be them (transformers loads such checkpoints too): they become null, with one warning."""
    src = data.get("src_vocab_size") or data.get("vocab_size")
    tgt = data.get("tgt_vocab_size") or data.get("vocab_size")
    if not (isinstance(src, int) and isinstance(tgt, int)):
        return  # config validation names the missing vocabulary
    dropped = []
    for key in SPECIAL_IDS:
        value, vocab = data.get(key), min(src, tgt) if key == "pad_id" else tgt
        if key not in overrides and isinstance(value, int) and value >= vocab:
            data[key] = None
            dropped.append(f"{key} {value}")
    if dropped:
        warnings.warn(f"{model_type} config.json sets {' and '.join(dropped)}, outside the vocabulary "
                      f"(0..{min(src, tgt) - 1}); no token can be that, so it is null. Pass e.g. "
                      f"{dropped[0].split()[0]}=... (--{dropped[0].split()[0].replace('_', '-')} on the "
                      "command line) to choose one.", UserWarning, stacklevel=_caller_level())


def config_from_hf(folder: str | Path, *, revision: str | None = None, **overrides: Any) -> ModelConfig:
    """The transformer_kit config equivalent to a checkpoint's ``config.json``.

    ``folder`` is a local checkpoint folder or a Hub name (``"Qwen/Qwen3-0.6B"``, at
    ``revision``), as in :func:`from_hf`. ``overrides`` replace keys of the result, e.g.
    ``pad_id=0`` for a GPT-2 without a pad token, ``eos_id=None``, or ``attention="matmul"``. A
    generating model's ``eos_id`` is every id that ends its text: config.json's,
    generation_config.json's and the tokenizer's ``eos_token`` (a list when they differ: a chat
    model's end of turn).
    """
    folder = checkpoint_folder(folder, revision=revision, weights=False)
    pipeline = read_sentence_pipeline(folder)
    body = pipeline.body if pipeline is not None else folder
    hf = read_hf_config(body)
    return kit_config(hf, checkpoint_family(hf, body).family, body, overrides,
                      TextTokenizer.from_folder(body), pipeline)


def kit_config(hf: dict, family: CheckpointFamily, folder: str | Path,
               overrides: dict[str, Any], tokenizer: TextTokenizer | None,
               pipeline: SentencePipeline | None = None) -> ModelConfig:
    """``family``'s kit config of config dict ``hf``, its eos ids completed, a
    sentence-transformers ``pipeline``'s keys and ``overrides`` applied."""
    try:
        data = family.to_config(hf)
    except KeyError as exc:
        raise CheckpointError(f"{family.model_type} config.json in {str(folder)!r} lacks {exc}.") from None
    if pipeline is not None:
        data = pipeline.apply(data)
    _drop_ids_outside_vocabulary(data, family.model_type, overrides)
    vocab = data.get("tgt_vocab_size") or data.get("vocab_size")
    if "eos_id" not in overrides and data.get("eos_id") is not None and isinstance(vocab, int):
        ids = end_ids(folder, hf.get("eos_token_id", data["eos_id"]), tokenizer, vocab)
        if data["eos_id"] not in ids:
            ids.insert(0, data["eos_id"])
        data["eos_id"] = ids[0] if len(ids) == 1 else ids
    return config_from_dict({**data, **overrides})


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _checkpoint_dtype(hf: dict) -> torch.dtype:
    """The dtype config.json says the weights are stored in (float32 when it does not say)."""
    name = hf.get("torch_dtype") or hf.get("dtype") or "float32"
    return DTYPES.get(str(name).removeprefix("torch."), torch.float32)


def _dtype(dtype: str | torch.dtype, hf: dict) -> torch.dtype:
    if dtype == "auto":
        return _checkpoint_dtype(hf)
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise InputError(f"dtype={dtype!r} is not supported; choose one of {', '.join(DTYPES)} or 'auto' "
                     "(the checkpoint's own, from config.json).")


def _fill(model: TransformerModel, state: dict[str, Tensor], dtype: torch.dtype) -> None:
    """Give the empty (meta) ``model`` its weights from ``state``, one tensor read at a time;
    a tied weight stays one parameter."""
    replaced: dict[int, nn.Parameter] = {}
    names = {id(p): n for n, p in model.named_parameters()}  # a tied weight: its first name
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None:
                continue
            if id(param) not in replaced:
                tensor = materialize(state[names[id(param)]])
                tensor = tensor.to(dtype) if tensor.is_floating_point() else tensor
                if tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size():
                    tensor = tensor.clone(memory_format=torch.contiguous_format)  # a slice: its own copy
                replaced[id(param)] = nn.Parameter(tensor, requires_grad=param.requires_grad)
            module._parameters[name] = replaced[id(param)]
    for name, buffer in model.named_buffers():
        if name in state:
            buffer.copy_(materialize(state[name]))


def from_hf(folder: str | Path, *, revision: str | None = None, dtype: str | torch.dtype = "float32",
            stream: bool = False, adapter: str | Path | None = None,
            adapters: dict[str, str | Path] | None = None, **overrides: Any) -> TransformerModel:
    """Load a Hugging Face checkpoint, a local folder or a Hub name, as an assembled
    transformer_kit model.

    The folder's ``model_type`` picks the checkpoint family a plugin registered (built in:
    gpt2, bert, llama, marian; ``tk.get_registry().model_types()`` lists them). The weights are
    read with safetensors (or ``torch.load(weights_only=True)``); the model's outputs equal the
    original's. ``overrides`` replace config keys (``pad_id=0``). The folder's tokenizer.json
    (and its config files) become ``model.tokenizer`` (text in, text out). The result is an
    ordinary model: ``model.save`` / ``tk.load_model`` and ``export_onnx`` work on it, and
    carry the tokenizer along.

    Args:
        folder: a local checkpoint folder, or a Hub repository id (``"Qwen/Qwen3-0.6B"``) whose
            files the kit reads (config, tokenizer, safetensors weights) ``huggingface_hub``
            downloads into its cache (``HF_HOME`` / ``HF_HUB_CACHE``; ``HF_HUB_OFFLINE=1``: the
            cache only; ``HF_TOKEN``: gated and private repositories). A local folder of the
            same name wins.
        revision: a Hub name's branch, tag or commit (its default branch when None).
        dtype: the parameters' dtype: ``"float32"`` (the default: outputs equal the original's
            in float32), ``"bfloat16"``, ``"float16"``, or ``"auto"`` for the checkpoint's own
            (config.json's ``torch_dtype``). The tensors are read and converted one at a time,
            so loading needs the model's memory in ``dtype`` and one tensor more.
        stream: keep the weights in the checkpoint (safetensors only): the model's parameters
            are on the ``meta`` device and ``export_onnx`` reads each weight as it writes it, so
            a model larger than memory exports. Such a model does not run in PyTorch.
        adapter: a PEFT LoRA adapter folder (``adapter_config.json`` and
            ``adapter_model.safetensors``) merged into the weights as PEFT's
            ``merge_and_unload`` does (see :mod:`transformer_kit.checkpoints.lora`).
        adapters: PEFT LoRA adapter folders by name, kept apart from the weights: each becomes
            factors of the kit's parameters in ``model.adapters[name]`` (``{parameter: (a,
            b)}``, ``weight + b @ a`` the merged weight), which ``export_onnx`` writes beside
            the base for ``OnnxModel.generate(..., adapter=name)`` to bind per call.
    """
    folder = checkpoint_folder(folder, revision=revision)
    pipeline = read_sentence_pipeline(folder)
    folder = pipeline.body if pipeline is not None else folder  # the Transformer module's
    hf = read_hf_config(folder)
    family = checkpoint_family(hf, folder).family
    tokenizer = TextTokenizer.from_folder(folder)
    config = kit_config(hf, family, folder, overrides, tokenizer, pipeline)
    dtype = _dtype(dtype, hf)
    tensors = open_checkpoint_tensors(folder)
    if tensors is None:
        if stream:
            raise CheckpointError(f"stream=True reads safetensors checkpoints; {str(folder)!r} holds "
                                  "PyTorch .bin weights. Load it without stream=True, or save it "
                                  "with safetensors.")
        tensors = read_hf_weights(folder)
    lora = read_adapter(adapter) if adapter is not None else None
    if lora is not None:
        tensors = merge_adapter(tensors, lora)
    state = family_state(hf, family, tensors, folder, config,
                         pipeline.state if pipeline is not None else None)
    if lora is not None:
        check_merged_used(tensors, lora, state)
    model = assemble(config, state, folder, dtype, tokenizer, stream)
    model.generation_defaults = generation_defaults(folder)
    if adapters:
        def mapping(named: dict[str, Tensor]) -> dict[str, Tensor]:
            return family_state(hf, family, named, folder, config)

        model.adapters = {name: kit_factors(read_adapter(path), tensors, mapping)
                          for name, path in adapters.items()}
    return model


def generation_defaults(folder: str | Path) -> dict[str, Any]:
    """The sampling defaults of the checkpoint in ``folder``: its generation_config.json's
    (:func:`~transformer_kit.core.decoding.defaults.read_defaults`), {} without one."""
    path = Path(folder) / "generation_config.json"
    if not path.is_file():
        return {}
    return read_defaults(read_json_object(path, CheckpointError, "Fix or remove generation_config.json."))


def family_state(hf: dict, family: CheckpointFamily, tensors: dict[str, Tensor], where: str | Path,
                 config: ModelConfig, extra: dict[str, Tensor] | None = None) -> dict[str, Tensor]:
    """The kit's state dict: ``family``'s mapping of the checkpoint's tensors (by Hugging Face
    name; :class:`~transformer_kit.checkpoints.deferred.DeferredTensor` s stay deferred) and
    ``extra`` (a sentence-transformers folder's dense layers), each name and shape checked
    against the model ``config`` builds (an empty one, on ``meta``)."""
    weights = Weights(tensors, where, family.prefixes, family.probe)
    state = {**family.to_state_dict(hf, weights, config), **(extra or {})}
    expected = build_model(config, empty=True).state_dict()
    missing = sorted(set(expected) - set(state))
    if missing:
        raise CheckpointError(f"Converting {str(where)!r} left {missing[:5]} unset.")
    for name, tensor in state.items():
        if name not in expected or expected[name].shape != tensor.shape:
            shape = tuple(expected[name].shape) if name in expected else "no such parameter"
            raise CheckpointError(
                f"Checkpoint tensor for {name!r} has shape {tuple(tensor.shape)}, the model built "
                f"from its config.json expects {shape}. config.json and the weights disagree."
            )
    return state


def assemble(config: ModelConfig, state: dict[str, Tensor], where: str | Path, dtype: torch.dtype,
             tokenizer: TextTokenizer | None, stream: bool = False) -> TransformerModel:
    """The model of ``config`` with the weights of ``state`` (read one at a time into
    ``dtype``, or kept in the checkpoint with ``stream``) and ``tokenizer``, in eval mode."""
    model = build_model(config, empty=True)
    if stream:
        model.streamed_weights = StreamedWeights(state, str(where))
        guard_streamed(model)
    else:
        _fill(model, state, dtype)
    model.tokenizer = tokenizer
    return model.eval()
