"""Adapters on disk and on the Hub: every file name and the format version (`files.py`), adapter save/load
(`adapter_io.py`), the swap that writes a folder at once (`atomic.py`), Trainer checkpoints (`checkpoint.py`), where
an adapter's files come from (`hub.py`), the model card and the upload (`card.py`). Nothing here imports the model:
`MemoryModel` calls in, read through the attributes `savable.SavableModel` names."""
