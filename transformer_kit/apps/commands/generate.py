"""``transformer-kit generate``: generation in onnxruntime from an export folder, from token ids
or text, with every decoding option; one row streams as it is chosen."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from transformer_kit.apps.commands import _options as opts
from transformer_kit.apps.sources import Provider, open_export, parse_ids
from transformer_kit.apps.terminal import console, fail
from transformer_kit.core.errors import TransformerKitError
from transformer_kit.runtime.one_shot import OneShotGeneration

_Opt = typer.Option


def generate(
    folder: Annotated[Path, typer.Argument(help="An export folder.")],
    ids: Annotated[str | None, _Opt(help='Prompt (or source) ids, rows separated by ";".')] = None,
    prompt: Annotated[list[str] | None, _Opt(help="A text prompt (repeat for a batch); needs the "
                                             "export's tokenizer.")] = None,
    max_new_tokens: Annotated[int, _Opt(help="Tokens to generate at most.")] = 16,
    min_new_tokens: opts.MinNewTokens = None,
    do_sample: opts.DoSample = False,
    temperature: opts.Temperature = None,
    top_k: opts.TopK = None,
    top_p: opts.TopP = None,
    min_p: opts.MinP = None,
    repetition_penalty: opts.RepetitionPenalty = None,
    no_repeat_ngram_size: opts.NoRepeatNgramSize = None,
    num_beams: Annotated[int | None, _Opt(help="Beam search with this many beams.")] = None,
    length_penalty: Annotated[float | None, _Opt(help="Beam scores / length**this.")] = None,
    num_return_sequences: Annotated[int | None, _Opt(help="Rows per prompt.")] = None,
    eos_id: opts.EosId = None,
    stop: opts.Stop = None,
    seed: opts.Seed = None,
    prompt_lookup_num_tokens: opts.PromptLookup = None,
    generation_config: opts.GenerationConfigMode = opts.GenerationMode.auto,
    provider: opts.ProviderOption = Provider.auto,
) -> None:
    """Generate in onnxruntime: greedy by default, --do-sample, --num-beams; text with --prompt."""
    if (ids is None) == (not prompt):
        raise typer.BadParameter("give either --ids or --prompt.", param_hint="--ids / --prompt")
    options = opts.given_options(
        max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens, do_sample=do_sample,
        temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
        repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size,
        num_beams=num_beams, length_penalty=length_penalty, num_return_sequences=num_return_sequences,
        eos_id=eos_id, stop=stop, seed=seed, prompt_lookup_num_tokens=prompt_lookup_num_tokens,
        use_generation_defaults=None if generation_config == opts.GenerationMode.auto else False)
    inputs, mask = (list(prompt), None) if prompt else _id_rows(parse_ids(ids))  # usage first
    try:
        om = open_export(folder, provider)
        opts.report_sampling(om, options)
        start = time.perf_counter()
        produced = _run(om, inputs, mask, options)
        elapsed = time.perf_counter() - start
    except TransformerKitError as exc:
        fail(exc)
    console.print(f"provider: {om.provider}", highlight=False)
    console.print(f"{produced} tokens in {elapsed * 1e3:.0f} ms "
                  f"({produced / max(elapsed, 1e-9):.0f} tokens/s)", highlight=False)


def _id_rows(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Rows of ids as a right-padded array and its attention mask (1 = real token)."""
    width = max(map(len, rows))
    ids = np.zeros((len(rows), width), np.int64)
    mask = np.zeros((len(rows), width), np.int64)
    for i, row in enumerate(rows):
        ids[i, :len(row)], mask[i, :len(row)] = row, 1
    return ids, mask


def _run(om, inputs, mask, options: dict[str, Any]) -> int:
    """Print what is generated (one row: as it comes); returns the number of tokens generated
    (each row's up to its eos)."""
    run = OneShotGeneration(om, inputs, attention_mask=mask, **options)
    if not run.streams:
        rows = run.generate()
        texts = rows.texts if run.is_text else [" ".join(map(str, row)) for row in rows.tokens.tolist()]
        for text in texts:
            console.print(text, highlight=False, markup=False)
        return rows.token_count
    stream = run.stream()
    for delta in stream:
        sys.stdout.write(delta.text if run.is_text else f"{delta.token_id} ")
        sys.stdout.flush()
    sys.stdout.write(stream.rest() + "\n")
    return len(stream.tokens)


def register(app: typer.Typer) -> None:
    app.command()(generate)
