"""One copy of every weight per export folder, and folders whose paths stay inside them: a
manifest or graph naming a file outside the folder (``..``, an absolute path, a link) is refused."""

from __future__ import annotations

import json
import shutil

import onnx
import pytest
import torch

import transformer_kit as tk
from tests.combinations import tiny_config
from transformer_kit.export import export_onnx
from transformer_kit.export.verify import random_ids, relative_error
from transformer_kit.export.weights import WEIGHTS_FILE
from transformer_kit.runtime import OnnxModel


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    """A decoder whose output head is its embedding table (vocabulary 500 x 32), exported."""
    torch.manual_seed(0)
    model = tk.build_model(tiny_config("decoder", vocab_size=500, d_model=32, d_ff=48,
                                       tie_embeddings=True, pad_id=0)).eval()
    folder = tmp_path_factory.mktemp("tied") / "onnx"
    return model, folder, export_onnx(model, folder)


def test_a_tied_head_is_stored_once(tied):
    model, folder, report = tied
    table = model.embed.token.weight
    assert report.graph_bytes[WEIGHTS_FILE] <= report.weight_bytes + 4096
    assert report.weight_bytes < 2 * table.numel() * 4  # the table is most of the model
    ids = random_ids(3, 9, 500, 0, seed=3)
    with torch.no_grad():
        expected = model(ids).numpy()
    assert relative_error(OnnxModel(folder, providers="cpu")(ids.numpy()), expected) <= 1e-4


def test_graphs_point_into_one_weights_file(tied):
    _, folder, _ = tied
    locations = set()
    for graph in ("model", "decoder_step"):
        for tensor in onnx.load(str(folder / f"{graph}.onnx"), load_external_data=False).graph.initializer:
            locations |= {e.value for e in tensor.external_data if e.key == "location"}
    assert locations == {WEIGHTS_FILE}
    assert not list(folder.glob("*.onnx.data"))


def _copy(folder, tmp_path):
    target = tmp_path / "export" / "onnx"
    shutil.copytree(folder, target)
    return target


def _edit_manifest(folder, edit) -> None:
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))


@pytest.mark.parametrize("where", ["parent", "absolute"])
def test_a_graph_file_outside_the_folder_is_refused(tied, tmp_path, where):
    folder = _copy(tied[1], tmp_path)
    outside = folder.parent / "model.onnx"
    shutil.copy(folder / "model.onnx", outside)
    name = "../model.onnx" if where == "parent" else str(outside)

    def edit(manifest):
        manifest["graphs"]["model"]["file"] = name

    _edit_manifest(folder, edit)
    with pytest.raises(tk.ArtifactError, match=r"names graph 'model' at .*outside the export folder"):
        OnnxModel(folder, providers="cpu")


def test_a_tokenizer_file_outside_the_folder_is_refused(tied, tmp_path):
    folder = _copy(tied[1], tmp_path)
    (folder.parent / "secret.txt").write_text("not a tokenizer")
    _edit_manifest(folder, lambda m: m.update(tokenizer=["../secret.txt"]))
    with pytest.raises(tk.ArtifactError, match=r"tokenizer file at '../secret.txt', outside"):
        OnnxModel(folder, providers="cpu")


def test_a_graph_linked_from_outside_the_folder_is_refused(tied, tmp_path):
    folder = _copy(tied[1], tmp_path)
    outside = folder.parent / "elsewhere.onnx"
    (folder / "model.onnx").rename(outside)
    (folder / "model.onnx").symlink_to(outside)
    with pytest.raises(tk.ArtifactError, match=r"outside the export folder"):
        OnnxModel(folder, providers="cpu")


def test_external_data_outside_the_folder_is_refused(tied, tmp_path):
    folder = _copy(tied[1], tmp_path)
    shutil.copy(folder / WEIGHTS_FILE, folder.parent / WEIGHTS_FILE)
    proto = onnx.load(str(folder / "decoder_step.onnx"), load_external_data=False)
    for tensor in proto.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = f"../{WEIGHTS_FILE}"
    onnx.save_model(proto, str(folder / "decoder_step.onnx"))
    with pytest.raises(tk.ArtifactError, match=r"decoder_step.onnx .* from '../weights.data', outside"):
        OnnxModel(folder, providers="cpu")
