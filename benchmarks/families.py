"""Checkpoint families in onnxruntime against transformers eager on the same checkpoint.

For each family, a random checkpoint of a small real shape (d_model 512, 8 heads, 6 layers,
vocabulary 8000; grouped KV heads 8 -> 2 where the family has them) is written by transformers
with ``save_pretrained``, then ``transformer-kit bench DIR --from-hf`` loads it with
``tk.from_hf``, exports it and times greedy generation (batch 1, a 16-token prompt, 32 new
tokens) in onnxruntime against the kit's PyTorch eager, transformers' eager ``generate`` and, where
installed, optimum, all in the same interleaved rounds.

    pip install -e ".[dev]"        # (optimum's row: the bench extra, transformers < 4.58)
    python benchmarks/families.py [--families mistral qwen2 gpt_neox] [--rounds 5]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import torch


def checkpoint(family: str, folder: Path, small: bool = False) -> Path:
    """A random ``family`` checkpoint (d_model 512, 6 layers, vocabulary 8000; ``small``: a tiny
    one) in ``folder``."""
    import transformers as hf

    if (folder / "config.json").exists():
        return folder
    torch.manual_seed(0)
    shared = {"vocab_size": 8000, "hidden_size": 512, "num_attention_heads": 8,
              "num_hidden_layers": 6, "intermediate_size": 1408, "max_position_embeddings": 1024,
              "bos_token_id": 1, "eos_token_id": 2}
    if small:
        shared.update(vocab_size=300, hidden_size=64, num_hidden_layers=2, intermediate_size=128)
    if family == "mistral":
        model = hf.MistralForCausalLM(hf.MistralConfig(**shared, num_key_value_heads=2, sliding_window=256))
    elif family == "qwen2":
        model = hf.Qwen2ForCausalLM(hf.Qwen2Config(**shared, num_key_value_heads=2))
    elif family == "gpt_neox":
        wide = {**shared, "intermediate_size": 4 * shared["hidden_size"]}  # GPT-NeoX's 4x
        model = hf.GPTNeoXForCausalLM(hf.GPTNeoXConfig(**wide))
    else:
        raise SystemExit(f"unknown family {family!r}: mistral, qwen2 or gpt_neox")
    model.save_pretrained(folder)
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=["mistral", "qwen2", "gpt_neox"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--small", action="store_true", help="tiny checkpoints (a smoke test)")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tk-families-"))
    for family in args.families:
        folder = checkpoint(family, workdir / family, args.small)
        shape = "tiny" if args.small else "d_model 512, 6 layers, vocabulary 8000"
        print(f"\n## {family} ({shape}), {folder}", flush=True)
        command = [sys.executable, "-m", "transformer_kit", "bench", str(folder), "--from-hf",
                   "--rounds", str(args.rounds), "-o", str(workdir / f"{family}-onnx")]
        subprocess.run(command, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
