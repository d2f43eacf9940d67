"""onnxruntime-genai as a peer: a local Llama-shaped checkpoint with a tokenizer, its model
builder run on it, and its generator timed as a benchmark runner.

The builder (``python -m onnxruntime_genai.models.builder``) imports model classes of recent
transformers releases, newer than optimum-onnx allows in the same environment (the bench extra
holds both). Where the running interpreter's transformers cannot import the builder, it runs in
a virtual environment made once in the work folder with onnxruntime-genai at the installed
version, the newest transformers and the pinned CPU torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import torch

from transformer_kit.apps.benchmark import Runner

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER_CORPUS = [f"the quick brown fox {i} jumps over the lazy dog, {i * 7} times" for i in range(400)]


def genai_version() -> str | None:
    """The installed onnxruntime-genai's version, or None."""
    try:
        return metadata.version("onnxruntime-genai")
    except metadata.PackageNotFoundError:
        return None


def llama_checkpoint(folder: Path, hidden: int = 512, layers: int = 8, heads: int = 8,
                     kv_heads: int = 2, intermediate: int = 1376, vocab: int = 8000) -> Path:
    """A random Llama checkpoint (transformers' save_pretrained) with a byte-level BPE
    tokenizer trained here (tokenizer.json, tokenizer_config.json), as the builder needs."""
    import transformers

    if (folder / "config.json").exists():
        return folder
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv_heads, intermediate_size=intermediate, vocab_size=vocab,
        max_position_embeddings=2048, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        tie_word_embeddings=False)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    write_tokenizer(folder, vocab)
    return folder


def write_tokenizer(folder: Path, vocab: int) -> None:
    """A byte-level BPE tokenizer of ``vocab`` tokens trained here (<pad> 0, <s> 1, </s> 2), as
    tokenizer.json and tokenizer_config.json in ``folder``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(TOKENIZER_CORPUS, trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "pad_token": "<pad>", "model_max_length": 2048}))


def _builder_python(workdir: Path) -> str:
    """An interpreter that can import onnxruntime-genai's builder (this one, or a venv made once)."""
    probe = subprocess.run([sys.executable, "-c", "import onnxruntime_genai.models.builder"],
                           capture_output=True, text=True)
    if probe.returncode == 0:
        return sys.executable
    venv = workdir / "genai-builder-venv"
    python = venv / "bin" / "python"
    if not python.exists():
        reason = probe.stderr.strip().splitlines()[-1]
        print(f"onnxruntime-genai's builder cannot be imported here ({reason}); installing it with "
              f"a recent transformers into {venv}", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "-c", str(ROOT / "constraints.txt"),
                        f"onnxruntime-genai=={genai_version()}", "transformers", "torch", "onnx_ir",
                        "tqdm"], check=True)
    return str(python)


def build_genai(checkpoint: Path, out: Path, precision: str, workdir: Path) -> Path:
    """onnxruntime-genai's model of ``checkpoint`` in ``precision`` (fp32 or int4) for the CPU,
    built once into ``out``."""
    if (out / "genai_config.json").exists():
        return out
    command = [_builder_python(workdir), "-m", "onnxruntime_genai.models.builder", "-i", str(checkpoint),
               "-o", str(out), "-p", precision, "-e", "cpu", "-c", str(workdir / "genai-cache")]
    result = subprocess.run(command, capture_output=True, text=True,
                            env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if result.returncode != 0:
        raise RuntimeError(f"onnxruntime-genai's builder failed:\n{result.stderr[-3000:]}")
    return out


class GenaiGenerator:
    """Greedy generation with onnxruntime-genai: exactly ``new_tokens`` per row (batch, prompt)."""

    def __init__(self, folder: Path) -> None:
        import onnxruntime_genai as og

        self.og = og
        self.model = og.Model(str(folder))

    def generate(self, ids: np.ndarray, new_tokens: int) -> np.ndarray:
        """(batch, prompt) int ids -> (batch, new_tokens) int64 greedy tokens."""
        og = self.og
        batch, length = ids.shape
        params = og.GeneratorParams(self.model)
        params.set_search_options(max_length=length + new_tokens, min_length=length + new_tokens,
                                  do_sample=False, batch_size=batch)
        generator = og.Generator(self.model, params)
        generator.append_tokens(np.ascontiguousarray(ids, dtype=np.int32))
        while not generator.is_done():
            generator.generate_next_token()
        return np.array([generator.get_sequence(row)[length:] for row in range(batch)], dtype=np.int64)


def genai_runner(name: str, generator: GenaiGenerator, ids: np.ndarray, new_tokens: int) -> Runner:
    return Runner(name, lambda: generator.generate(ids, new_tokens), lambda out: int(out.size))
