"""The options shared by several commands: the generation options of the commands that generate
(``generate``, ``chat``), with the keyword options they give, and the source options of the
serving commands (``serve``, ``chat``); their typer declarations (``Annotated`` types).

Not a command: the module's name starts with ``_``, so the CLI does not register it."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any

import typer

from transformer_kit.apps.sources import REVISION_HELP, Provider

_Opt = typer.Option

MinNewTokens = Annotated[int | None, _Opt(help="No eos or stop before this many.")]
DoSample = Annotated[bool, _Opt("--do-sample", help="Sample instead of greedy.")]
Temperature = Annotated[float | None, _Opt(help="Sampling temperature (> 0).")]
TopK = Annotated[int | None, _Opt(help="Sample among the k most likely.")]
TopP = Annotated[float | None, _Opt(help="Nucleus sampling mass, in (0, 1].")]
MinP = Annotated[float | None, _Opt(help="Drop tokens below min_p x the top one.")]
RepetitionPenalty = Annotated[float | None, _Opt(help="> 1 discourages repeats.")]
NoRepeatNgramSize = Annotated[int | None, _Opt(help="No n-gram of this size twice.")]
EosId = Annotated[list[int] | None, _Opt(help="An id that ends a row (repeatable).")]
Stop = Annotated[list[str] | None, _Opt(help="A string that ends a row (repeatable).")]
Seed = Annotated[int | None, _Opt(help="Sampling seed: same seed, same tokens.")]
PromptLookup = Annotated[int | None, _Opt(help="Speculative decoding: draft up to this many tokens "
                                          "a step from the prompt and output (one prompt).")]
ProviderOption = Annotated[Provider, _Opt("--provider", help="Where onnxruntime runs.")]


class GenerationMode(str, Enum):
    auto = "auto"
    ignore = "ignore"


#: --generation-config: the checkpoint's sampling defaults (auto, as vLLM's) or none.
GenerationConfigMode = Annotated[GenerationMode, _Opt(
    help="auto: where a call sets no sampling option, use the checkpoint's generation_config.json "
    "(do_sample, temperature, top_p, top_k, min_p, repetition_penalty; a temperature of 0 is "
    "greedy); ignore: the kit's defaults (greedy; the server: OpenAI's).")]


class Quantization(str, Enum):
    int8 = "int8"
    int4 = "int4"


#: A serving command's SOURCE: an export, or a checkpoint it exports first.
SERVED_SOURCE = ("An export folder, or a checkpoint exported first into the kit's cache (once; "
                 "reused while unchanged): a Hugging Face checkpoint folder, a GGUF file, a folder "
                 "saved with model.save, or a Hub name (org/name, org/name:FILE.gguf).")
RevisionOption = Annotated[str | None, _Opt(help=REVISION_HELP)]
ServedQuantize = Annotated[Quantization | None, _Opt(help="A checkpoint's export here: int8 or int4 "
                                                     "weights (the kit's defaults); default "
                                                     "float32. For other options export first.")]


def given_options(*, do_sample: bool = False, **values: Any) -> dict[str, Any]:
    """The generation keywords the command line gave: the values that are not None, and
    ``do_sample`` when it is set (the rest keep the kit's defaults)."""
    options = {key: value for key, value in values.items() if value is not None}
    if do_sample:
        options["do_sample"] = True
    return options


def report_sampling(model: Any, options: dict[str, Any]) -> None:
    """Print (to stderr, apart from the output) the sampling options a run of ``model`` with the
    command line's ``options`` uses when its checkpoint has sampling defaults (its
    generation_config.json's): the options given over them. Without defaults, nothing: the
    options are those given."""
    from transformer_kit.core.decoding.defaults import describe, with_defaults

    if not model.generation_defaults:
        return
    effective = with_defaults(model.generation_defaults, options)
    source = (" (the checkpoint's generation_config.json under the options given)"
              if options.get("use_generation_defaults", True) else " (--generation-config ignore)")
    typer.echo(f"sampling: {describe(effective)}{source}", err=True)
