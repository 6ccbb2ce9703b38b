"""Training reporters shared by the tests (pytest puts tests/ on sys.path, beside conftest.py)."""

from __future__ import annotations

from eemicrogpt_core.training.trainer import NullReporter


class StopAt(NullReporter):
    """Raises KeyboardInterrupt once training reaches `step`, as a Ctrl-C between chunks would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def progress(self, step: int, total: int, train_loss: float) -> None:
        if step >= self.step:
            raise KeyboardInterrupt


class Messages(NullReporter):
    """Keeps the run's messages (stops, notes) for the test to read."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    def message(self, text: str) -> None:
        self.messages.append(text)
