"""from_hf: small random checkpoints made with transformers load into assembled models whose
outputs equal the original's, in PyTorch and in onnxruntime, and generate the same tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers as hf

import transformer_kit as tk
from transformer_kit.checkpoints import config_from_hf
from transformer_kit.export import OnnxModel, export_onnx
from transformer_kit.export.verify import relative_error

TOLERANCE = 1e-4
VOCAB = 61


def _gpt2(n_embd, n_head, n_layer, **extra):
    return hf.GPT2LMHeadModel(hf.GPT2Config(
        vocab_size=VOCAB, n_positions=40, n_embd=n_embd, n_head=n_head, n_layer=n_layer,
        bos_token_id=1, eos_token_id=2, **extra))


def _bert(hidden, heads, layers, **extra):
    return hf.BertModel(hf.BertConfig(
        vocab_size=VOCAB, hidden_size=hidden, num_attention_heads=heads, num_hidden_layers=layers,
        intermediate_size=2 * hidden + 3, max_position_embeddings=40, **extra),
        add_pooling_layer=False)


def _llama(hidden, heads, kv_heads, layers, **extra):
    return hf.LlamaForCausalLM(hf.LlamaConfig(
        vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden + 6,
        num_attention_heads=heads, num_key_value_heads=kv_heads, num_hidden_layers=layers,
        max_position_embeddings=64, bos_token_id=1, eos_token_id=2, **extra))


def _marian(d_model, heads, enc, dec, **extra):
    model = hf.MarianMTModel(hf.MarianConfig(
        vocab_size=VOCAB, d_model=d_model, encoder_attention_heads=heads,
        decoder_attention_heads=heads, encoder_layers=enc, decoder_layers=dec,
        encoder_ffn_dim=2 * d_model, decoder_ffn_dim=2 * d_model, max_position_embeddings=64,
        pad_token_id=VOCAB - 1, decoder_start_token_id=VOCAB - 1, eos_token_id=0,
        init_std=0.2, **extra))  # a wider init than Marian's 0.02, so greedy tokens vary
    with torch.no_grad():
        model.final_logits_bias.normal_(std=0.05)  # zero at init; make its mapping count
    return model


CHECKPOINTS = {
    "gpt2-3heads-1layer": lambda: _gpt2(12, 3, 1),
    "gpt2-5heads-3layers-relu": lambda: _gpt2(20, 5, 3, activation_function="relu", n_inner=28),
    "bert-3heads-1layer": lambda: _bert(12, 3, 1),
    "bert-5heads-3layers": lambda: _bert(20, 5, 3, type_vocab_size=3),
    "llama-6heads-kv2-2layers": lambda: _llama(24, 6, 2, 2),
    "llama-4heads-kv1-1layer-tied": lambda: _llama(16, 4, 1, 1, tie_word_embeddings=True,
                                                   rope_theta=500000.0),
    "llama-5heads-kv5-3layers": lambda: _llama(20, 5, 5, 3, attention_bias=True),
    "marian-3heads-2+1layers-swish": lambda: _marian(12, 3, 2, 1, scale_embedding=True,
                                                     activation_function="swish"),
    "marian-4heads-1+3layers-gelu": lambda: _marian(16, 4, 1, 3, activation_function="gelu"),
}


@pytest.fixture(scope="module", params=list(CHECKPOINTS), ids=list(CHECKPOINTS))
def checkpoint(request, tmp_path_factory):
    torch.manual_seed(sum(map(ord, request.param)))
    reference = CHECKPOINTS[request.param]().eval()
    folder = tmp_path_factory.mktemp(request.param.replace("+", "_"))
    reference.save_pretrained(folder)
    overrides = {"pad_id": 0} if reference.config.model_type in ("gpt2", "llama") else {}
    model = tk.from_hf(folder, **overrides)
    return reference, model, folder


def _batch(model, batch=3, length=9, seed=0):
    """Ids avoiding special tokens, with right padding in row 1 (and a short row 2)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB - 2, (batch, length), generator=gen)
    pad = model.config.pad_id
    ids[1, length - 3:] = pad
    if batch > 2:
        ids[2, 4:] = pad
    return ids, (ids != pad).long()


def _reference_outputs(reference, model, ids, mask) -> tuple[torch.Tensor, tuple]:
    """The original's output for our inputs, and the inputs our model takes."""
    kind = reference.config.model_type
    with torch.no_grad():
        if kind == "bert":
            return reference(input_ids=ids, attention_mask=mask).last_hidden_state, (ids,)
        if kind == "marian":
            tgt = torch.randint(3, VOCAB - 2, (ids.shape[0], 5), generator=torch.Generator().manual_seed(1))
            out = reference(input_ids=ids, attention_mask=mask, decoder_input_ids=tgt).logits
            return out, (ids, tgt)
        return reference(input_ids=ids, attention_mask=mask).logits, (ids,)


def _real(x: torch.Tensor | np.ndarray, mask: torch.Tensor, kind: str) -> np.ndarray:
    """Positions that are real tokens (padded positions are not defined alike everywhere)."""
    x = np.asarray(x)
    if kind == "marian":
        return x  # the target has no padding
    return x[mask.numpy().astype(bool)]


def test_outputs_equal_the_original_in_pytorch(checkpoint):
    reference, model, _ = checkpoint
    ids, mask = _batch(model)
    expected, inputs = _reference_outputs(reference, model, ids, mask)
    with torch.no_grad():
        ours = model(*inputs)
    kind = reference.config.model_type
    assert ours.shape == expected.shape
    assert relative_error(_real(ours, mask, kind), _real(expected, mask, kind)) <= TOLERANCE


def test_outputs_equal_the_original_in_onnxruntime(checkpoint, tmp_path):
    reference, model, _ = checkpoint
    report = export_onnx(model, tmp_path / "onnx")
    assert report.max_error <= TOLERANCE
    ids, mask = _batch(model, batch=2, length=11, seed=2)
    expected, inputs = _reference_outputs(reference, model, ids, mask)
    om = OnnxModel(tmp_path / "onnx", providers="cpu")
    ours = om(*[x.numpy() for x in inputs])
    kind = reference.config.model_type
    assert relative_error(_real(ours, mask, kind), _real(expected, mask, kind)) <= TOLERANCE
    if kind != "bert":
        _check_generation(reference, model, om)


def _check_generation(reference, model, om):
    """Greedy onnxruntime generation equals transformers' greedy generate, token for token."""
    cfg = model.config
    ids, mask = _batch(model, batch=3, length=6, seed=3)
    gen = hf.GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=12,
                              pad_token_id=cfg.pad_id, eos_token_id=cfg.eos_id,
                              bos_token_id=cfg.bos_id, decoder_start_token_id=cfg.bos_id)
    if reference.config.model_type == "marian":
        # Marian's config forces eos at the length limit; the kit's greedy decoding does not.
        reference.config.forced_eos_token_id = None
        reference.generation_config.forced_eos_token_id = None
        with torch.no_grad():
            out = reference.generate(input_ids=ids, attention_mask=mask, generation_config=gen)
        expected = out[:, 1:].numpy()  # transformers keeps the decoder start token
        ours = om.generate(ids.numpy(), max_new_tokens=12)
    else:
        order = torch.argsort(mask, dim=1, stable=True)  # transformers wants left padding
        left, left_mask = ids.gather(1, order), mask.gather(1, order)
        with torch.no_grad():
            out = reference.generate(input_ids=left, attention_mask=left_mask, generation_config=gen)
        expected = out[:, ids.shape[1]:].numpy()
        ours = om.generate(ids.numpy(), max_new_tokens=12)  # right-padded in: left-aligned inside
    np.testing.assert_array_equal(ours, expected)
    np.testing.assert_array_equal(model.generate(ids, max_new_tokens=12).numpy(), expected)
    assert expected.shape[1] >= 3 and len(np.unique(expected)) >= 2  # not one repeated token


def test_config_round_trips_through_save_and_load(checkpoint, tmp_path):
    reference, model, folder = checkpoint
    overrides = {"pad_id": 0} if reference.config.model_type in ("gpt2", "llama") else {}
    assert config_from_hf(folder, **overrides) == model.config
    model.save(tmp_path / "saved")
    loaded = tk.load_model(tmp_path / "saved").eval()
    assert loaded.config == model.config
    ids, mask = _batch(model)
    _, inputs = _reference_outputs(reference, model, ids, mask)
    with torch.no_grad():
        assert torch.equal(loaded(*inputs), model(*inputs))


def test_pytorch_bin_checkpoints_load_with_weights_only(tmp_path):
    torch.manual_seed(0)
    reference = _llama(16, 4, 2, 1).eval()
    reference.config.save_pretrained(tmp_path)
    torch.save(reference.state_dict(), tmp_path / "pytorch_model.bin")  # the pre-safetensors layout
    model = tk.from_hf(tmp_path)
    ids = torch.randint(3, VOCAB, (2, 5))
    with torch.no_grad():
        assert relative_error(model(ids), reference(input_ids=ids).logits) <= TOLERANCE


def test_unsupported_and_broken_checkpoints(tmp_path):
    t5 = tmp_path / "t5"
    hf.T5Config(vocab_size=10, d_model=8, num_layers=1, num_heads=2, d_ff=8, d_kv=4).save_pretrained(t5)
    supported = r"model_type 't5'.*Supported model types: bert, gpt2, llama, marian"
    with pytest.raises(tk.TransformerKitError, match=supported):
        tk.from_hf(t5)
    with pytest.raises(tk.TransformerKitError, match=r"config.json is missing"):
        tk.from_hf(tmp_path / "nothing")
    gpt2 = tmp_path / "gpt2"
    _gpt2(12, 3, 1).save_pretrained(gpt2)
    (gpt2 / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(tk.TransformerKitError, match=r"Cannot read the weights"):
        tk.from_hf(gpt2)
    (gpt2 / "model.safetensors").unlink()
    with pytest.raises(tk.TransformerKitError, match=r"has no weights"):
        tk.from_hf(gpt2)
