"""Synthetic tasks that show whether a memory works (no downloads)."""

from .recall import RecallTask, train_recall

__all__ = ["RecallTask", "train_recall"]
