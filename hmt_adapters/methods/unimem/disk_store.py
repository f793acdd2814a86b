"""Blocks kept in memory-mapped files (InfLLM's store past a RAM budget; docs/infllm.md, "The store").

A block, once cut, is never written again, so a file-backed copy is all it needs: `DiskPages.place` copies a CPU
tensor into a page of a file mapped with `torch.from_file(shared=True)` and returns a view of it. The operating
system keeps the pages it has room for in its cache and reads the others back when a chunk retrieves them, so the
store's RAM is what the reads touch, not the document. Each page's file is unlinked as soon as it is mapped: the
space is the kernel's until the last tensor viewing the page is freed, and nothing is left behind by a process that
ends or fails.
"""

from __future__ import annotations

import os
import tempfile

import torch

PAGE_BYTES = 64 * 2**20  # one file per 64 MB of blocks
ALIGN = 64  # byte alignment of every placed tensor (any dtype's element size divides it)


class DiskPages:
    """File-backed storage for immutable CPU tensors in `directory` (created if missing)."""

    def __init__(self, directory: str, page_bytes: int = PAGE_BYTES):
        self.directory = directory
        self.page_bytes = page_bytes
        self._page: torch.Tensor | None = None  # uint8 [page_bytes] of the page being filled
        self._used = 0

    def _new_page(self, nbytes: int) -> None:
        os.makedirs(self.directory, exist_ok=True)
        fd, path = tempfile.mkstemp(dir=self.directory, prefix="infllm-blocks-", suffix=".bin")
        os.close(fd)
        size = max(self.page_bytes, nbytes)
        self._page = torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
        try:
            os.unlink(path)  # the mapping keeps the space; the file name is gone (see the module docstring)
        except OSError:  # a platform that refuses to unlink an open file keeps it until the process ends
            pass
        self._used = 0

    def place(self, x: torch.Tensor) -> torch.Tensor:
        """A file-backed copy of the CPU tensor `x` (same shape, dtype and values)."""
        if x.device.type != "cpu":
            raise ValueError(f"`store_disk` keeps blocks in CPU memory-mapped files; this block is on {x.device}.")
        nbytes = x.numel() * x.element_size()
        start = -(-self._used // ALIGN) * ALIGN
        if self._page is None or start + nbytes > self._page.numel():
            self._new_page(nbytes)
            start = 0
        assert self._page is not None
        out = self._page[start : start + nbytes].view(x.dtype).view(x.shape)
        out.copy_(x)
        self._used = start + nbytes
        return out
