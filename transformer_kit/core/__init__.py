"""The core: what every other layer stands on, and what names no implementation.

Its public names are the package root's (``import transformer_kit as tk``: ``tk.Component``,
``tk.hookimpl``, ``tk.build_model``, ``tk.GenerationConfig``, the errors, the registry); plugin
authors also import the interfaces (:mod:`transformer_kit.core.interfaces`) and the masks
(:mod:`transformer_kit.core.masks`). The modules:

- contracts: ``interfaces`` (a Transformer's parts), ``component`` (``Component``, ``Lowering``,
  ``CheckpointFamily``), ``hookspecs``, ``registry`` and ``registry_entries``,
  ``factory_arguments``, ``capabilities``, ``errors``;
- configs: ``config``, ``config_files``, ``layer_types``, ``sentence_config``;
- the PyTorch model: ``attention``, ``masks``, ``inputs``, ``id_checks``, ``stacks``, ``model``,
  ``assembly`` (``build_model``), ``serialization``, ``memory``;
- written once for both runtimes (numpy): ``decoding`` (options, logits processors, greedy,
  sampling, beams, speculative decoding, response formats) and ``embedding`` (sentence
  embeddings and reranking).

Nothing here imports torch at package import; the PyTorch modules are imported where used, so
the runtime layer can stand on the numpy ones without torch installed.
"""
