"""The engine's counters, one meaning each (read by the servers' metrics and by tests)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class EngineStats:
    """What an engine has done since it started.

    ``batch_size``: rows in the running batch now (a generation engine), or requests in the
    last call of the model (a pooling engine); ``max_batch_size``: the most so far (more than
    1: requests of several callers ran together).
    """

    requests: int = 0  # requests that ended, for any reason
    finished: dict[str, int] = field(default_factory=dict)  # finish reason -> requests
    generated_tokens: int = 0  # tokens chosen for generation requests
    steps: int = 0  # runs of the step graph after a prefill (a speculative check counts one)
    prefills: int = 0  # runs prefilling waiting prompts
    encoded: int = 0  # sources the encoder ran on (a speech model's requests, one run each)
    drafted_tokens: int = 0  # tokens prompt lookup drafted
    accepted_tokens: int = 0  # drafted tokens that were the model's own choice
    input_tokens: int = 0  # tokens embedded or scored by pooling requests
    inputs: int = 0  # inputs (texts, pairs) embedded or scored
    calls: int = 0  # pooling calls: requests gathered and run together
    runs: int = 0  # runs of the forward graph by pooling calls
    batch_size: int = 0
    max_batch_size: int = 0

    def ended(self, reason: str) -> None:
        """Count a request that ended with ``reason``."""
        self.finished[reason] = self.finished.get(reason, 0) + 1
        self.requests += 1

    def batched(self, size: int) -> None:
        """The running batch (or the last call) holds ``size`` rows (requests)."""
        self.batch_size = size
        self.max_batch_size = max(self.max_batch_size, size)
