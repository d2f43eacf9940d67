"""``transformer-kit transcribe``: speech to text from an export of a speech model (Whisper), in
onnxruntime, with a progress bar per file; text, json, verbose_json (with ``--words``, each word's
times), srt or vtt."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from transformer_kit.apps.sources import Provider, open_export
from transformer_kit.apps.terminal import console, errors, fail
from transformer_kit.core.errors import TransformerKitError
from transformer_kit.core.speech import load_audio
from transformer_kit.core.speech.formats import FORMATS, render
from transformer_kit.core.speech_config import SAMPLING_RATE

_Opt = typer.Option


def transcribe(
    folder: Annotated[Path, typer.Argument(help="An export folder of a speech model (Whisper).")],
    files: Annotated[list[Path], typer.Argument(help="Audio files (flac, mp3, mp4, m4a, ogg, wav, "
                                                "webm, ...: any format FFmpeg reads).")],
    response_format: Annotated[str, _Opt("--format", help=f"One of {', '.join(FORMATS)}.")] = "text",
    output_dir: Annotated[Path | None, _Opt("--output-dir", "-o", help="Write each file's result "
                                            "there as <name>.<format> instead of printing it.")] = None,
    language: Annotated[str | None, _Opt(help="The spoken language's code (default: detected; "
                                         "English for English-only models).")] = None,
    task: Annotated[str, _Opt(help="transcribe, or translate (into English).")] = "transcribe",
    prompt: Annotated[str | None, _Opt(help="Text that came before (names, spellings).")] = None,
    temperature: Annotated[float | None, _Opt(help="One temperature (default: 0, falling back "
                                              "to 0.2 ... 1.0 where the text repeats).")] = None,
    num_beams: Annotated[int, _Opt(help="Beam search with this many beams (1: greedy).")] = 1,
    words: Annotated[bool, _Opt("--words", help="Time each word (verbose_json's words) by the "
                                "model's alignment heads: one more pass per 30 s window.")] = False,
    provider: Annotated[Provider, _Opt(help="Where onnxruntime runs.")] = Provider.auto,
) -> None:
    """Transcribe audio files with an exported Whisper model; a progress bar on long files."""
    if response_format not in FORMATS:
        raise typer.BadParameter(f"{response_format!r} is not one of {', '.join(FORMATS)}.",
                                 param_hint="--format")
    if words and response_format != "verbose_json":
        raise typer.BadParameter(f"word timestamps come in verbose_json only (--format given: "
                                 f"{response_format}); add --format verbose_json.",
                                 param_hint="--words")
    options = {"language": language, "task": task, "prompt": prompt, "num_beams": num_beams,
               "word_timestamps": words}
    if temperature is not None:
        options["temperature"] = temperature
    try:
        om = open_export(folder, provider)
        if output_dir is not None:
            output_dir.mkdir(parents=True, exist_ok=True)
        for file in files:
            result = _transcribe(om, file, options)
            written = render(result, response_format, words=words)
            if output_dir is None:
                console.print(written.rstrip("\n"), highlight=False, markup=False)
            else:
                target = output_dir / f"{file.stem}.{'json' if 'json' in response_format else response_format}"
                partial = target.with_name(f".{target.name}.partial")
                partial.write_text(written, encoding="utf-8")
                partial.replace(target)  # never a half-written file under the final name
                console.print(f"{file} -> {target}", highlight=False)
    except TransformerKitError as exc:
        fail(exc)


def _transcribe(om, file: Path, options: dict):
    samples = load_audio(file)  # first, so that the bar knows the duration
    columns = (TextColumn("{task.description}"), BarColumn(),
               TextColumn("{task.completed:.0f}/{task.total:.0f} s"), TimeRemainingColumn())
    with Progress(*columns, console=errors, transient=True) as bar:  # stdout keeps the text
        task_id = bar.add_task(file.name, total=len(samples) / SAMPLING_RATE)

        def progress(done: float, total: float) -> None:
            bar.update(task_id, completed=done, total=total)

        return om.transcribe(samples, progress=progress, **options)


def register(app: typer.Typer) -> None:
    app.command()(transcribe)
