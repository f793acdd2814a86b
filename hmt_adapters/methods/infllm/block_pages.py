"""Blocks kept in 64 MB pages, in RAM or in memory-mapped files (InfLLM's store; docs/infllm.md, "The store").

A block, once cut, is never written again, so it can live as a view of a larger buffer: `BlockPages.place` copies
a tensor into the page being filled and returns a CPU view of it.

- **In RAM** (`directory=None`, every CPU store): one 64 MB allocation per page instead of one ~100 KB allocation
  per block and layer. Allocated one by one, blocks land in the C allocator's heap between the short-lived buffers
  of every chunk (the tail grown and cut, the attention logits), and the heap keeps the holes: on SmolLM2-135M the
  resident memory grew by ~69 KB per token read for 46.6 KB of K/V (docs/infllm.md, "The store"). A page is its own
  mapping, returned to the system when the last block viewing it is freed.
- **In files** (`directory`, `store_disk`): a page of a file mapped with `torch.from_file(shared=True)`. The
  operating system keeps the pages it has room for in its cache and reads the others back when a chunk retrieves
  them, so the store's RAM is what the reads touch, not the document. Each page's file is unlinked as soon as it is
  mapped: the space is the kernel's until the last tensor viewing the page is freed, and nothing is left behind by a
  process that ends or fails.

Pages are touched only where written (the system commits memory on first write), so the page being filled costs
what it holds. A file page that is full is dropped from the process's page tables (`madvise(MADV_DONTNEED)`, Linux):
its contents stay in the file and the system's page cache, and a read maps back only what it touches. Kept mapped,
every block written stayed in the process's resident set, and a 1M-token read's resident set counted its whole
11 GB store (docs/infllm.md, "A million tokens").
"""

from __future__ import annotations

import ctypes
import os
import sys
import tempfile
import weakref

import torch

PAGE_BYTES = 64 * 2**20  # one page (one allocation or one file) per 64 MB of blocks
ALIGN = 64  # byte alignment of every placed tensor (any dtype's element size divides it)
MADV_DONTNEED = 4  # <sys/mman.h> on Linux


def _libc_madvise():
    """libc's `madvise`, or None where there is none to call (not Linux, or no libc found)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes, madvise.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return madvise


_MADVISE = _libc_madvise()


class BlockPages:
    """Page storage for immutable tensors: in RAM, or in memory-mapped files in `directory` (created if missing)."""

    def __init__(self, directory: str | None = None, page_bytes: int = PAGE_BYTES):
        self.directory = directory
        self.page_bytes = page_bytes
        self._page: torch.Tensor | None = None  # uint8 [page_bytes] of the page being filled
        self._used = 0
        self._full: list[weakref.ref] = []  # storages of the full file pages that blocks still view

    def release_full_pages(self) -> int:
        """Drop every full file page from the process's resident set (see the module docstring); the next read of
        a block maps back what it touches. Returns the number of pages dropped (0 in RAM or off Linux)."""
        storages = [s for s in (ref() for ref in self._full) if s is not None]
        self._full = [weakref.ref(s) for s in storages]
        if _MADVISE is None:
            return 0
        for storage in storages:
            _MADVISE(storage.data_ptr(), storage.nbytes(), MADV_DONTNEED)
        return len(storages)

    def __deepcopy__(self, memo: dict) -> BlockPages:
        """A copied model gets a store of its own; blocks already placed stay where they are (their states hold
        them)."""
        return BlockPages(self.directory, self.page_bytes)

    def _new_page(self, nbytes: int) -> None:
        if self.directory is not None and self._page is not None:
            self._full.append(weakref.ref(self._page.untyped_storage()))
            self.release_full_pages()
        size = max(self.page_bytes, nbytes)
        if self.directory is None:
            self._page = torch.empty(size, dtype=torch.uint8)
        else:
            os.makedirs(self.directory, exist_ok=True)
            fd, path = tempfile.mkstemp(dir=self.directory, prefix="infllm-blocks-", suffix=".bin")
            os.close(fd)
            self._page = torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
            try:
                os.unlink(path)  # the mapping keeps the space; the file name is gone (see the module docstring)
            except OSError:  # a platform that refuses to unlink an open file keeps it until the process ends
                pass
        self._used = 0

    def place(self, x: torch.Tensor) -> torch.Tensor:
        """A CPU copy of `x` (same shape, dtype and values; `x` on any device, no graph: the caller keeps tensors
        that require grad out, `InfLLM._store_block`) in the page being filled."""
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


def resident_kib_by_mapping() -> dict[str, int]:
    """Resident KiB of this process per mapping name, from `/proc/self/smaps` (Linux): a mapped file's path,
    `[heap]`, `[stack]`, ..., and "" for anonymous mappings; mappings of one name summed. What a store in files
    holds in RAM (a page file's path; docs/infllm.md, "The store")."""
    out: dict[str, int] = {}
    name = ""
    with open("/proc/self/smaps") as fh:
        for line in fh:
            fields = line.split()
            if "-" in fields[0] and not fields[0].endswith(":"):  # a mapping's header: range, perms, ..., name
                name = fields[5] if len(fields) > 5 else ""
            elif fields[0] == "Rss:":
                out[name] = out.get(name, 0) + int(fields[1])
    return out
