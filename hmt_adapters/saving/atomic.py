"""`replace_folder`: a new version of a folder written beside it and swapped in at once, so an error or a kill while
writing leaves the earlier version whole and a reader never sees a mix of two (the adapter folder, docs/adapters.md).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator

logger = logging.getLogger(__name__)

# names written by the new version -> names of the old version that go instead of being carried over
Replaced = Callable[[set[str]], tuple[str, ...]]


@contextlib.contextmanager
def replace_folder(directory: str, replaced: Replaced = lambda written: (), last: str | None = None) -> Iterator[str]:
    """Yield an empty staging folder for the new version of `directory`; when the block ends without an error, the
    files of an existing `directory` that the new version does not write are hard-linked in (except those
    `replaced(written)` names) and the complete folder replaces `directory` in one rename. The staging folder is
    removed in any case, and staging folders a killed write left behind are removed by the next one. Files get the
    modes a plain `open` would give under the process umask. Where the parent is read-only and `directory` a writable
    folder, the version is staged inside `directory` and moved in file by file, `last` last."""
    directory = os.path.abspath(directory)
    parent = os.path.dirname(directory)
    os.makedirs(parent, exist_ok=True)
    prefix = f".{os.path.basename(directory)}.tmp-"
    staged_inside = False
    try:
        tmp = tempfile.mkdtemp(dir=parent, prefix=prefix)
    except PermissionError:  # a writable folder in a read-only parent: stage inside it (same file system)
        if not os.path.isdir(directory):
            raise
        parent, prefix, staged_inside = directory, ".hmt-adapters.tmp-", True
        tmp = tempfile.mkdtemp(dir=directory, prefix=prefix)
    _remove_leftovers(parent, prefix, keep=tmp)
    try:
        yield tmp
        _umask_modes(tmp)
        if staged_inside:
            _move_files_in(tmp, directory, replaced, last)
        else:
            _swap_in(tmp, directory, replaced)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _link_or_copy(src: str, dst: str) -> None:
    """Hard-link `src` at `dst` (same file system: no copy), or copy it where links are not possible."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _carry_over(directory: str, tmp: str, replaced: Replaced) -> None:
    """Put into `tmp` what `directory` holds and the new version does not write (an adapter folder's tokenizer, a
    Trainer's state), as hard links, except the names `replaced(written)` says go with the old version."""
    written = set(os.listdir(tmp))
    dropped = replaced(written)
    stale = []
    for name in os.listdir(directory):
        if name in written:
            continue
        if name in dropped:
            stale.append(name)
            continue
        src, dst = os.path.join(directory, name), os.path.join(tmp, name)
        if os.path.isdir(src) and not os.path.islink(src):
            shutil.copytree(src, dst, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(src, dst)
    if stale:
        logger.info("Removed %s of an earlier save from %s: this save does not write them.", stale, directory)


def _exchange(a: str, b: str) -> bool:
    """Swap the paths `a` and `b` in one step (Linux `renameat2(RENAME_EXCHANGE)`); False where that is unavailable."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def _swap_in(tmp: str, directory: str, replaced: Replaced) -> None:
    """Make the complete new folder `tmp` the folder `directory` in one rename: a reader sees the old version or the
    new one, never a mix. Afterwards `tmp` holds the old folder (removed by the caller)."""
    if not os.path.exists(directory):
        os.replace(tmp, directory)
        return
    _carry_over(directory, tmp, replaced)
    if _exchange(tmp, directory):
        return
    old = tmp + ".old"  # no atomic exchange here: two renames, the folder is absent (never mixed) in between
    os.rename(directory, old)
    os.rename(tmp, directory)
    os.rename(old, tmp)


def _move_files_in(tmp: str, directory: str, replaced: Replaced, last: str | None) -> None:
    """Move every entry of `tmp` into `directory` (`last` last): only where `tmp` had to be staged inside
    `directory` itself (a writable folder in a read-only parent), which leaves no folder to swap."""
    written = sorted(os.listdir(tmp), key=lambda n: n == last)
    for name in written:
        target = os.path.join(directory, name)
        if os.path.isdir(os.path.join(tmp, name)) and os.path.isdir(target):
            shutil.rmtree(target)  # e.g. a peft adapter saved under a non-default name
        os.replace(os.path.join(tmp, name), target)
    for name in replaced(set(written)):
        if name not in written and os.path.isfile(os.path.join(directory, name)):
            os.remove(os.path.join(directory, name))


def _umask_modes(folder: str) -> None:
    """The modes a plain `open`/`mkdir` would give under the process umask (0644 / 0755 with umask 022), for the
    staging folder (`mkdtemp` makes it 0700) and every file in it (safetensors writes 0600), so a saved adapter is
    as readable as the rest of the user's files."""
    probe = os.path.join(folder, ".umask-probe")  # made as open() makes files (0o666 & ~umask): no global umask call
    os.close(os.open(probe, os.O_CREAT | os.O_WRONLY, 0o666))
    umask = 0o666 & ~os.stat(probe).st_mode
    os.remove(probe)
    os.chmod(folder, 0o777 & ~umask)
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        os.chmod(path, (0o777 if os.path.isdir(path) else 0o666) & ~umask)


def _remove_leftovers(parent: str, prefix: str, keep: str) -> None:
    """Remove the staging folders of earlier saves that were interrupted (killed) before they could clean up."""
    for name in os.listdir(parent):
        path = os.path.join(parent, name)
        if name.startswith(prefix) and path != keep and os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
