"""The applications on top of the kit: the ``transformer-kit`` command (one module per command in
``commands/``), the demo, the plots, the benchmark harness and the server (``serving/``: the
continuous-batching engine and the OpenAI-compatible HTTP app). They use the core, the plugins
and the export layer; nothing below imports them."""
