"""OnnxModel: input checks, damaged artifacts, providers, no torch needed, 8 threads at once."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
import torch

import transformer_kit as tk
from tests.combinations import tiny_config
from transformer_kit.export import export_onnx
from transformer_kit.runtime import OnnxModel


@pytest.fixture(scope="module")
def decoder_export(tmp_path_factory):
    torch.manual_seed(0)
    model = tk.build_model(tiny_config("decoder", positional="learned", max_len=16,
                                       attention="sdpa")).eval()
    folder = tmp_path_factory.mktemp("decoder")
    export_onnx(model, folder)
    return model, folder


@pytest.fixture(scope="module")
def seq2seq_export(tmp_path_factory):
    torch.manual_seed(0)
    model = tk.build_model(tiny_config("encoder_decoder", positional="sinusoidal")).eval()
    folder = tmp_path_factory.mktemp("seq2seq")
    export_onnx(model, folder)
    return model, folder


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (np.ones((1, 3), np.float32), "integer token ids"),
        (np.ones(3, np.int64), r"shape \(batch, len\)"),
        (np.zeros((1, 0), np.int64), "empty"),
        (np.array([[3, 37]]), "token id 37, outside the vocabulary 0..36"),
        (np.array([[3, -2]]), "token id -2"),
        (np.ones((1, 17), np.int64), "needs 17 positions.*cover 16"),
        ("3 4 5", "numpy array or torch tensor"),
    ],
)
def test_bad_inputs_are_refused_before_onnxruntime(decoder_export, bad, message):
    _, folder = decoder_export
    om = OnnxModel(folder, providers="cpu")
    with pytest.raises(tk.InputError, match=message):
        om(bad)


def test_generation_arguments_are_checked(decoder_export):
    _, folder = decoder_export
    om = OnnxModel(folder, providers="cpu")
    with pytest.raises(tk.InputError, match=r"max_new_tokens=-1 is not allowed"):
        om.generate(np.array([[3, 4]]), max_new_tokens=-1)
    with pytest.raises(tk.InputError, match=r"18 in all.*context length is 16"):
        om.generate(np.array([[3, 4, 5, 6]]), max_new_tokens=14)
    with pytest.raises(tk.InputError, match=r"rows \[1\] hold only padding"):
        om.generate(np.array([[3, 4], [0, 0]]), max_new_tokens=2)
    assert om.generate(np.array([[3, 4]]), max_new_tokens=0).shape == (1, 0)
    with pytest.raises(tk.InputError, match=r"takes 1 input"):
        om(np.array([[3]]), np.array([[4]]))


def test_lists_and_torch_tensors_are_accepted(decoder_export):
    model, folder = decoder_export
    om = OnnxModel(folder, providers="cpu")
    ids = [[5, 6, 7], [8, 9, 0]]
    np.testing.assert_allclose(om(ids), om(torch.tensor(ids)), rtol=0, atol=0)
    np.testing.assert_allclose(om(ids), model(torch.tensor(ids)).detach().numpy(), rtol=1e-4, atol=1e-5)


def test_seq2seq_input_checks(seq2seq_export):
    _, folder = seq2seq_export
    om = OnnxModel(folder, providers="cpu")
    with pytest.raises(tk.InputError, match=r"src_ids has 2 rows but tgt_ids has 1"):
        om(np.ones((2, 4), np.int64), np.ones((1, 3), np.int64))
    with pytest.raises(tk.InputError, match=r"tgt_ids holds token id 99"):
        om(np.ones((1, 4), np.int64), np.array([[1, 99]]))


def _copy(folder, tmp_path):
    target = tmp_path / "copy"
    shutil.copytree(folder, target)
    return target


def test_truncated_graph_is_a_typed_error(decoder_export, tmp_path):
    _, folder = decoder_export
    copy = _copy(folder, tmp_path)
    data = (copy / "decoder_step.onnx").read_bytes()
    (copy / "decoder_step.onnx").write_bytes(data[: len(data) // 3])
    with pytest.raises(tk.ArtifactError, match=r"cannot load .*decoder_step.onnx.*export the model again"):
        OnnxModel(copy, providers="cpu")


def test_manifest_that_does_not_match_its_graphs(decoder_export, tmp_path):
    _, folder = decoder_export
    copy = _copy(folder, tmp_path)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["graphs"]["model"]["inputs"] = ["tokens"]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(tk.ArtifactError, match=r"does not match the manifest"):
        OnnxModel(copy, providers="cpu")
    (copy / "manifest.json").write_text("{not json")
    with pytest.raises(tk.ArtifactError, match=r"not valid JSON"):
        OnnxModel(copy, providers="cpu")
    (copy / "manifest.json").unlink()
    with pytest.raises(tk.ArtifactError, match=r"manifest.json is missing"):
        OnnxModel(copy, providers="cpu")
    with pytest.raises(tk.ArtifactError, match=r"'.*elsewhere' does not exist"):
        OnnxModel(tmp_path / "elsewhere", providers="cpu")


def test_explicit_providers_and_session_options_pass_through(decoder_export):
    import onnxruntime as ort

    _, folder = decoder_export
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    om = OnnxModel(folder, providers=["CPUExecutionProvider"], session_options=options)
    assert om.provider == "CPUExecutionProvider"
    assert om.session("model").get_session_options().intra_op_num_threads == 1
    assert om.session("decoder_step").get_session_options().intra_op_num_threads == 1
    with pytest.raises(tk.ProviderError, match=r"'NoSuchExecutionProvider' is not available"):
        OnnxModel(folder, providers=["NoSuchExecutionProvider"])
    with pytest.raises(tk.InputError, match=r"not one of 'auto', 'cpu', 'cuda'"):
        OnnxModel(folder, providers="tpu")


def _run_python(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRANSFORMER_KIT")}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=env, timeout=120, check=False)


def test_auto_providers_fall_back_quietly_and_torch_is_not_needed(decoder_export):
    model, folder = decoder_export
    ids = np.array([[5, 6, 7, 8], [9, 10, 0, 0]])
    expected = model.generate(torch.from_numpy(ids), max_new_tokens=6).numpy()
    result = _run_python(f"""
        import sys
        sys.modules["torch"] = None  # any import of torch now fails
        import numpy as np
        from transformer_kit.runtime import OnnxModel
        om = OnnxModel({str(folder)!r})
        print(om.provider)
        print(om.generate(np.array({ids.tolist()}), max_new_tokens=6).tolist())
    """)
    assert result.returncode == 0, result.stderr
    provider, tokens = result.stdout.strip().splitlines()
    from transformer_kit.runtime.providers import cuda_works

    assert provider == ("CUDAExecutionProvider" if cuda_works() else "CPUExecutionProvider")
    assert json.loads(tokens) == expected.tolist()
    assert "onnxruntime" not in result.stderr  # no native error flood from a failed CUDA probe


def test_one_model_shared_by_eight_threads(decoder_export):
    _, folder = decoder_export
    om = OnnxModel(folder, providers="cpu")
    rng = np.random.default_rng(0)
    jobs = []
    for i in range(8):
        ids = rng.integers(3, 37, size=(1 + i % 3, 4 + i % 5))
        if len(ids) > 1:
            ids[-1, -2:] = 0
        jobs.append(ids)
    sequential = [(om(ids), om.generate(ids, max_new_tokens=6)) for ids in jobs]
    results: dict[int, list] = {i: [] for i in range(8)}
    errors = []

    def work(i: int) -> None:
        try:
            for _ in range(5):
                results[i].append((om(jobs[i]), om.generate(jobs[i], max_new_tokens=6)))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i, runs in results.items():
        assert len(runs) == 5
        for logits, tokens in runs:
            np.testing.assert_array_equal(logits, sequential[i][0])
            np.testing.assert_array_equal(tokens, sequential[i][1])


@torch.no_grad()
def test_cpu_sessions_skip_the_skip_layer_norm_fusion_and_agree_with_it(tmp_path):
    """The CPU default leaves out onnxruntime's SkipLayerNormFusion (measured slower); both
    ways give PyTorch's output."""
    torch.manual_seed(0)
    model = tk.build_model(tiny_config("encoder", attention="sdpa", block="post_norm", pad_id=0)).eval()
    export_onnx(model, tmp_path / "onnx")
    default = OnnxModel(tmp_path / "onnx", "cpu")
    fused = OnnxModel(tmp_path / "onnx", "cpu", disabled_optimizers=())
    assert default._disabled_optimizers == ["SkipLayerNormFusion"] and fused._disabled_optimizers == []
    ids = torch.tensor([[3, 4, 5, 0], [6, 7, 8, 9]])
    expected = model(ids).numpy()
    np.testing.assert_allclose(default(ids.numpy()), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(fused(ids.numpy()), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("architecture", ["decoder", "encoder_decoder"])
def test_decoding_through_onnxruntimes_public_binding_gives_pytorchs_beams(decoder_export, seq2seq_export,
                                                                           architecture):
    """Decoding binds through onnxruntime's public IOBinding; beams and several sequences per
    prompt (rows reordered every step) give PyTorch's tokens."""
    model, folder = decoder_export if architecture == "decoder" else seq2seq_export
    ids = np.array([[3, 4, 5, 6], [7, 8, 9, 10]])
    ours = OnnxModel(folder, providers="cpu").generate(ids, 5, num_beams=3, num_return_sequences=2)
    assert np.array_equal(ours, model.generate(torch.from_numpy(ids), 5, num_beams=3,
                                               num_return_sequences=2).numpy())


