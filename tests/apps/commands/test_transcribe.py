"""transformer-kit transcribe: an export of Whisper tiny.en's real weights on LibriVox clips; its
output in each format is what OnnxModel.transcribe renders, files written whole, and a file that
is not audio gets one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.apps.conftest import invoke
from tests.conftest import SPEECH_CLIPS
from transformer_kit.core.speech.formats import render
from transformer_kit.runtime import OnnxModel


@pytest.fixture(scope="module")
def clips() -> list[Path]:
    return sorted(Path(SPEECH_CLIPS).glob("*.wav"))[:2]


def test_srt_is_what_the_runtime_renders(whisper_tiny_en, clips):
    _, export = whisper_tiny_en
    result = invoke("transcribe", str(export), str(clips[0]), "--format", "srt")
    assert result.exit_code == 0, result.output
    expected = render(OnnxModel(export, providers="cpu").transcribe(clips[0]), "srt")
    assert result.stdout == expected.rstrip("\n") + "\n"
    assert expected.startswith("1\n00:00:00,000 --> 00:00:07,000\nAnd Mr. John Dashwood")


def test_output_dir_gets_one_file_per_input(whisper_tiny_en, clips, tmp_path):
    _, export = whisper_tiny_en
    result = invoke("transcribe", str(export), *map(str, clips), "--format", "verbose_json",
                    "-o", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    written = sorted((tmp_path / "out").iterdir())
    assert [p.name for p in written] == [f"{clip.stem}.json" for clip in clips]
    first = json.loads(written[0].read_text())
    assert first["language"] == "en" and first["segments"][0]["start"] == 0.0
    assert "Dashwood" in first["text"]


def test_words_are_the_runtimes_word_timestamps(whisper_tiny_en, clips):
    _, export = whisper_tiny_en
    result = invoke("transcribe", str(export), str(clips[0]), "--format", "verbose_json", "--words")
    assert result.exit_code == 0, result.output
    want = OnnxModel(export, providers="cpu").transcribe(clips[0], word_timestamps=True)
    assert json.loads(result.stdout)["words"] == [
        {"word": w["word"].strip(), "start": w["start"], "end": w["end"]} for w in want.words]
    refused = invoke("transcribe", str(export), str(clips[0]), "--words")
    assert refused.exit_code == 2 and "verbose_json" in refused.output


def test_a_file_that_is_not_audio_gets_one_line(whisper_tiny_en, tmp_path):
    _, export = whisper_tiny_en
    notes = tmp_path / "notes.txt"
    notes.write_text("not a sound\n")
    result = invoke("transcribe", str(export), str(notes))
    assert result.exit_code == 1
    assert "could not be read as audio" in result.output and "Traceback" not in result.output
    result = invoke("transcribe", str(export), str(notes), "--format", "docx")
    assert result.exit_code == 2 and "srt" in result.output
