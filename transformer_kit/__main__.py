"""``python -m transformer_kit [CONFIG]``: assemble a model, decode, export to ONNX, decode again.

With no CONFIG it uses the built-in paper config (``transformer_kit/configs/paper.yaml``).
It prints the components and the parameter count, greedy-decodes a random batch in PyTorch
with and without the key/value cache, exports the model to ONNX (``--out``, default
``./transformer-kit-out``; ``--no-export`` skips it), decodes the same batch in onnxruntime and
checks that all three give the same tokens.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

import transformer_kit as tk

BUILTIN_CONFIGS = Path(__file__).parent / "configs"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m transformer_kit", description=__doc__.split("\n")[0])
    parser.add_argument("config", nargs="?", default=str(BUILTIN_CONFIGS / "paper.yaml"),
                        help="a .yaml/.yml/.json config, or the name of a built-in one "
                             f"({', '.join(p.stem for p in sorted(BUILTIN_CONFIGS.glob('*.yaml')))})")
    parser.add_argument("--batch", type=int, default=2, help="rows to decode (default 2)")
    parser.add_argument("--prompt-len", type=int, default=12, help="tokens per row (default 12)")
    parser.add_argument("--max-new-tokens", type=int, default=24, help="default 24")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="transformer-kit-out", help="ONNX export folder")
    parser.add_argument("--no-export", action="store_true", help="skip the ONNX export")
    return parser.parse_args(argv)


def _timed_generate(model, ids, max_new_tokens: int, use_cache: bool) -> tuple[torch.Tensor, float]:
    start = time.perf_counter()
    tokens = model.generate(ids, max_new_tokens=max_new_tokens, use_cache=use_cache)
    return tokens, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    config_path = Path(args.config)
    if not config_path.exists() and (BUILTIN_CONFIGS / f"{args.config}.yaml").exists():
        config_path = BUILTIN_CONFIGS / f"{args.config}.yaml"
    torch.manual_seed(args.seed)
    try:
        model = tk.build_model(config_path).eval()
        cfg = model.config
        vocab = cfg.src_vocab if cfg.architecture == "encoder_decoder" else cfg.vocab_size
        low = max(i for i in (cfg.pad_id, cfg.bos_id, cfg.eos_id) if i is not None) + 1
        ids = torch.randint(low, vocab, (args.batch, args.prompt_len))
        if args.batch > 1 and args.prompt_len > 2:
            ids[-1, -args.prompt_len // 3:] = cfg.pad_id if cfg.pad_id is not None else ids[-1, 0]
        print(f"config     {config_path}")
        print(f"model      {cfg.architecture}, d_model {cfg.d_model}, {cfg.num_heads} heads "
              f"({cfg.kv_heads} KV), layers {cfg.n_encoder_layers if cfg.architecture != 'decoder' else 0}"
              f"+{cfg.n_decoder_layers if cfg.architecture != 'encoder' else 0}, "
              f"{sum(p.numel() for p in model.parameters()):,} parameters")
        print("components " + ", ".join(f"{k}={cfg.component(k).name}" for k in tk.KINDS))
        if cfg.architecture == "encoder":
            hidden = model(ids)
            print(f"forward    {tuple(ids.shape)} -> {tuple(hidden.shape)}, finite: "
                  f"{bool(torch.isfinite(hidden).all())}")
            return 0
        cached, t_cached = _timed_generate(model, ids, args.max_new_tokens, True)
        uncached, t_uncached = _timed_generate(model, ids, args.max_new_tokens, False)
        steps = cached.shape[1]
        print(f"input      {ids.tolist()}")
        print(f"generated  {cached.tolist()}  (random weights: the tokens mean nothing)")
        print(f"PyTorch cached   {args.batch * steps / t_cached:8.1f} tokens/s")
        print(f"PyTorch uncached {args.batch * steps / t_uncached:8.1f} tokens/s")
        same = torch.equal(cached, uncached)
        print(f"cached == uncached: {same}")
        if args.no_export:
            return 0 if same else 1
        from transformer_kit.export import OnnxModel, export_onnx

        print(f"exporting to {args.out} ...", flush=True)
        print(export_onnx(model, args.out))
        om = OnnxModel(args.out)
        start = time.perf_counter()
        onnx_tokens = om.generate(ids.numpy(), max_new_tokens=args.max_new_tokens)
        elapsed = time.perf_counter() - start
    except tk.TransformerKitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"onnxruntime ({om.provider}) {onnx_tokens.size / elapsed:8.1f} tokens/s")
    same_onnx = bool((onnx_tokens == cached.numpy()).all()) and onnx_tokens.shape == tuple(cached.shape)
    print(f"onnxruntime == PyTorch: {same_onnx}")
    return 0 if same and same_onnx else 1


if __name__ == "__main__":
    raise SystemExit(main())
