"""Long-document data for memory training: load documents, tokenize, cut windows, pad batches; two offline corpora."""

from .collator import WindowCollator
from .corpora import (
    austen_documents,
    austen_text,
    jane_austen,
    kjv_bible,
    kjv_documents,
    load_corpus,
    split_by_document,
)
from .documents import load_documents
from .windows import make_windows, tokenize_documents

__all__ = [
    "WindowCollator",
    "austen_documents",
    "austen_text",
    "jane_austen",
    "kjv_bible",
    "kjv_documents",
    "load_corpus",
    "load_documents",
    "make_windows",
    "split_by_document",
    "tokenize_documents",
]
