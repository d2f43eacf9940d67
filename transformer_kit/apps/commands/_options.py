"""The generation options shared by the commands that generate (``generate``, ``chat``): their
typer declarations (``Annotated`` types, one per option) and the keyword options they give.

Not a command: the module's name starts with ``_``, so the CLI does not register it."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from transformer_kit.apps.sources import Provider

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


def given_options(*, do_sample: bool = False, **values: Any) -> dict[str, Any]:
    """The generation keywords the command line gave: the values that are not None, and
    ``do_sample`` when it is set (the rest keep the kit's defaults)."""
    options = {key: value for key, value in values.items() if value is not None}
    if do_sample:
        options["do_sample"] = True
    return options
