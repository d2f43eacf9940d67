"""The applications on top of the kit: the ``transformer-kit`` command (one module per command in
``commands/``), the demo, the plots and the benchmark harness. They use the core, the plugins and
the export layer; nothing below imports them."""
