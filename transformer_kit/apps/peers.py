"""The peers the benchmarks compare with: transformers in PyTorch and optimum's onnxruntime
models, on checkpoints written locally with transformers' save_pretrained (no model hub)."""

from __future__ import annotations

from pathlib import Path

import torch

from transformer_kit.apps.benchmark import Runner


def gpt2_checkpoint(folder: Path, vocab: int = 8000, d_model: int = 512, layers: int = 6,
                    heads: int = 8) -> Path:
    import transformers

    if not (folder / "config.json").exists():
        torch.manual_seed(0)
        config = transformers.GPT2Config(n_embd=d_model, n_layer=layers, n_head=heads,
                                         vocab_size=vocab, n_positions=1024, bos_token_id=1,
                                         eos_token_id=vocab - 1)
        transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    return folder


def bert_checkpoint(folder: Path) -> Path:
    import transformers

    if not (folder / "config.json").exists():
        torch.manual_seed(0)
        config = transformers.BertConfig(hidden_size=512, num_hidden_layers=6, num_attention_heads=8,
                                         intermediate_size=2048, vocab_size=30522)
        transformers.BertModel(config, add_pooling_layer=False).save_pretrained(folder)
    return folder


def hf_generation_runners(checkpoint: Path, workdir: Path, ids: torch.Tensor, new_tokens: int,
                          with_transformers: bool = True) -> list[Runner]:
    """transformers in PyTorch and optimum's ORTModelForCausalLM on the same checkpoint, where
    installed; both forced to exactly ``new_tokens`` greedy tokens. Missing ones are skipped."""
    runners = []
    kwargs = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens, "do_sample": False,
              "attention_mask": torch.ones_like(ids)}
    try:
        import transformers
    except ImportError:
        return runners
    if with_transformers:
        hf = transformers.AutoModelForCausalLM.from_pretrained(checkpoint).eval()

        def hf_eager():
            with torch.inference_mode():
                return hf.generate(ids, pad_token_id=0, **kwargs)[:, ids.shape[1]:]

        runners.append(Runner(f"transformers {transformers.__version__}, PyTorch eager", hf_eager,
                              lambda out: int(out.numel())))
    optimum = load_optimum_causal_lm(checkpoint, workdir)
    if optimum is not None:
        def ort_optimum():
            return optimum.generate(ids, pad_token_id=0, **kwargs)[:, ids.shape[1]:]

        runners.append(Runner(f"{optimum_version()}, onnxruntime", ort_optimum,
                              lambda out: int(out.numel()), note="ORTModelForCausalLM, IO binding"))
    return runners


def optimum_version() -> str:
    """optimum-onnx's version (where optimum's ONNX Runtime models live since optimum 2)."""
    from importlib import metadata

    try:
        return f"optimum-onnx {metadata.version('optimum-onnx')}"
    except metadata.PackageNotFoundError:
        return f"optimum {metadata.version('optimum')}"


def load_optimum_causal_lm(checkpoint: Path, workdir: Path):
    """optimum's ORTModelForCausalLM for ``checkpoint`` (exported once into ``workdir``), or
    None when optimum is not installed."""
    try:
        from optimum.onnxruntime import ORTModelForCausalLM
    except ImportError:
        return None
    folder = workdir / "optimum-causal-lm"
    if not (folder / "model.onnx").exists():
        ORTModelForCausalLM.from_pretrained(checkpoint, export=True, use_cache=True).save_pretrained(folder)
    return ORTModelForCausalLM.from_pretrained(folder, use_io_binding=True)
