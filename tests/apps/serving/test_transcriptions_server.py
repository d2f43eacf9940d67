"""POST /v1/audio/transcriptions and /v1/audio/translations with the official openai client, over
an export of Whisper tiny.en's real weights on LibriVox clips: every response format is what
OnnxModel.transcribe renders (srt and vtt parsed as subtitles by pysubs2), a stream's deltas make
the whole text, concurrent files batch their windows and each gets its lone answer, and bad files
get 400 with a sentence while the server keeps serving."""

from __future__ import annotations

import json
import math
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pysubs2
import pytest

from tests.conftest import SPEECH_CLIPS
from transformer_kit.apps.serving.http import create_app, serve_in_thread
from transformer_kit.core.speech.formats import render
from transformer_kit.runtime import Engine, OnnxModel

MODEL = "tiny.en"
KEY = "sk-speech"


@pytest.fixture(scope="module")
def clips() -> list[Path]:
    return sorted(Path(SPEECH_CLIPS).glob("*.wav"))


@pytest.fixture(scope="module")
def model(whisper_tiny_en) -> OnnxModel:
    return OnnxModel(whisper_tiny_en[1], providers="cpu")


@pytest.fixture(scope="module")
def server(model):
    """(base URL, engine) of a speech server with an API key, audio of at most 60 s."""
    engine = Engine(model, max_batch=8)
    with serve_in_thread(create_app(engine, MODEL, api_key=KEY, max_audio_seconds=60)) as url:
        yield url, engine
    engine.close()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server[0] + "/v1", api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def expected(model, clips) -> dict[Path, object]:
    """Each clip's transcription by OnnxModel.transcribe (the server's defaults: greedy with the
    temperature fallback)."""
    return {clip: model.transcribe(clip) for clip in clips}


def _transcribe(client: openai.OpenAI, clip: Path, **fields):
    with open(clip, "rb") as file:
        return client.audio.transcriptions.create(model=MODEL, file=file, **fields)


def test_json_and_text_are_the_runtimes_transcription(client, clips, expected):
    answer = _transcribe(client, clips[0])
    assert answer.text == expected[clips[0]].text.strip()
    assert answer.usage.type == "duration"
    assert answer.usage.seconds == math.ceil(expected[clips[0]].duration)
    text = _transcribe(client, clips[1], response_format="text")
    assert text == render(expected[clips[1]], "text")


def test_verbose_json_segments_are_the_runtimes(client, clips, expected):
    answer = _transcribe(client, clips[2], response_format="verbose_json",
                         timestamp_granularities=["segment"])
    want = expected[clips[2]]
    assert answer.language == "en" and answer.duration == pytest.approx(want.duration, abs=1e-3)
    assert [(s.start, s.end, s.text) for s in answer.segments] == [
        (round(s.start, 3), round(s.end, 3), s.text) for s in want.segments]
    assert answer.segments[0].tokens == want.segments[0].tokens


def test_word_granularity_gives_the_runtimes_words(client, model, clips):
    want = model.transcribe(clips[1], word_timestamps=True)
    both = _transcribe(client, clips[1], response_format="verbose_json",
                       timestamp_granularities=["word", "segment"])
    assert [(w.word, w.start, w.end) for w in both.words] == [
        (w["word"].strip(), w["start"], w["end"]) for w in want.words]
    assert [s.text for s in both.segments] == [s.text for s in want.segments]
    words = _transcribe(client, clips[1], response_format="verbose_json", timestamp_granularities=["word"])
    assert words.words == both.words and words.segments is None
    with pytest.raises(openai.BadRequestError, match="Word timestamps come in verbose_json only"):
        _transcribe(client, clips[1], timestamp_granularities=["word"])


@pytest.mark.parametrize("response_format", ["srt", "vtt"])
def test_subtitles_parse_as_subtitles(client, clips, expected, response_format):
    answer = _transcribe(client, clips[3], response_format=response_format)
    assert answer == render(expected[clips[3]], response_format)
    events = pysubs2.SSAFile.from_string(answer, format_=response_format).events
    want = [s for s in expected[clips[3]].segments if s.text.strip()]
    assert [(e.start, e.end, e.plaintext) for e in events] == [
        (round(s.start * 1000), round(s.end * 1000), s.text.strip()) for s in want]


def test_a_stream_is_the_whole_text(client, clips, expected):
    events = list(_transcribe(client, clips[4], stream=True))
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    done = [e for e in events if e.type == "transcript.text.done"]
    assert len(done) == 1 and events[-1] is done[0] and deltas
    assert "".join(deltas).strip() == done[0].text == expected[clips[4]].text.strip()


def test_concurrent_files_batch_and_each_gets_its_lone_answer(server, client, clips):
    lone = {clip: _transcribe(client, clip).text for clip in clips}
    files = [clips[i % len(clips)] for i in range(8)]
    before = server[1].stats.max_batch_size
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda clip: _transcribe(client, clip).text, files))
    assert answers == [lone[clip] for clip in files]
    assert server[1].stats.max_batch_size > max(before, 1)  # windows of several files decoded together


def test_bad_files_get_400_with_a_sentence_and_the_server_serves_on(server, client, clips, tmp_path):
    with pytest.raises(openai.BadRequestError, match="could not be read as audio"):
        client.audio.transcriptions.create(model=MODEL, file=("notes.wav", b"not a sound"))
    with pytest.raises(openai.BadRequestError, match=r"could not be read as audio|no audio samples"):
        client.audio.transcriptions.create(model=MODEL, file=("empty.wav", b""))
    long = tmp_path / "long.wav"  # the clips (25 s) joined three times: past the server's 60 s
    _join(clips * 3, long)
    with pytest.raises(openai.BadRequestError, match="longer than 60 s"):
        _transcribe(client, long)
    translated = httpx.post(server[0] + "/v1/audio/translations", data={"model": MODEL},
                            files={"file": (clips[0].name, clips[0].read_bytes())},
                            headers={"Authorization": f"Bearer {KEY}"})
    assert translated.status_code == 400
    assert "English-only and cannot translate" in translated.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError, match="English-only; language 'xx'"):
        _transcribe(client, clips[0], language="xx")
    with pytest.raises(openai.BadRequestError, match="stream gives the text as events"):
        list(_transcribe(client, clips[0], response_format="srt", stream=True))
    with pytest.raises(openai.NotFoundError, match="does not exist here"), open(clips[0], "rb") as file:
        client.audio.transcriptions.create(model="whisper-1", file=file)
    assert _transcribe(client, clips[0]).text.startswith("And Mr. John Dashwood")
    metrics = httpx.get(server[0] + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    served = re.search(r'transformer_kit_audio_seconds_total\{endpoint="/v1/audio/transcriptions"\} (\S+)',
                       metrics)
    assert served and float(served.group(1)) > 0  # the answered files' audio counted


def test_the_form_is_checked_and_the_guard_holds(server, clips):
    url = server[0] + "/v1/audio/transcriptions"
    audio = clips[0].read_bytes()
    files = {"file": (clips[0].name, audio, "audio/wav")}
    assert httpx.post(url, files=files, data={"model": MODEL}).status_code == 401
    headers = {"Authorization": f"Bearer {KEY}"}
    unknown = httpx.post(url, files=files, data={"model": MODEL, "beam_size": "5"}, headers=headers)
    assert unknown.status_code == 400 and "beam_size" in unknown.json()["error"]["message"]
    hot = httpx.post(url, files=files, data={"model": MODEL, "temperature": "3"}, headers=headers)
    assert hot.status_code == 400 and "temperature" in hot.json()["error"]["message"]
    no_file = httpx.post(url, data={"model": MODEL}, headers=headers)
    assert no_file.status_code == 400 and "file" in no_file.json()["error"]["message"]


def test_the_body_bound_is_413(model, clips):
    engine = Engine(model, max_batch=2)
    try:
        with serve_in_thread(create_app(engine, MODEL, max_body_bytes=64 * 1024)) as url:
            answer = httpx.post(url + "/v1/audio/transcriptions",
                                files={"file": ("a.wav", clips[0].read_bytes())}, data={"model": MODEL})
        assert answer.status_code == 413
    finally:
        engine.close()


def test_a_text_model_names_its_endpoints(onnx_model, clips):
    engine = Engine(onnx_model)
    try:
        with serve_in_thread(create_app(engine, "tiny")) as url:
            answer = httpx.post(url + "/v1/audio/transcriptions",
                                files={"file": ("a.wav", clips[0].read_bytes())}, data={"model": "tiny"})
        assert answer.status_code == 400
        assert "text generator" in json.loads(answer.text)["error"]["message"]
    finally:
        engine.close()


def _join(clips: list[Path], out: Path) -> None:
    """The clips' samples one after another, as a 16 kHz wav file."""
    import wave

    frames = []
    for clip in clips:
        with wave.open(str(clip)) as each:
            params = each.getparams()
            frames.append(each.readframes(each.getnframes()))
    with wave.open(str(out), "wb") as joined:
        joined.setparams(params)
        joined.writeframes(b"".join(frames))
