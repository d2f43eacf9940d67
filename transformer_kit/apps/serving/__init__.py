"""Serving an export over HTTP (OpenAI's convention), Ray Serve and Triton: thin front-ends over
the runtime's :class:`~transformer_kit.runtime.Service` and its one engine."""
