"""Helpers the tests and the benchmarks share — peers' runners, random checkpoints, a local
Triton server — not part of the installed kit (pyproject's package list holds only
``transformer_kit``): importable from the repository's root."""
