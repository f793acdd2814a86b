"""Adapters on disk and on the Hub: every file name, the format version and what saving reads of a model
(`files.py`), adapter save/load (`adapter_io.py`), the swap that writes a folder at once (`atomic.py`), Trainer
checkpoints (`checkpoint.py`), where an adapter's files come from (`hub.py`), the model card and the upload
(`card.py`). Nothing here imports the model: `MemoryModel` calls in, read through `files.SavableModel`."""
