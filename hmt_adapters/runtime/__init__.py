"""The segment engine: it knows no method by name and no file.

- `segments.py`: `SegmentRuntime`, which runs closed segments through a `MemoryMethod` (truncated BPTT, per-segment
  checkpointing, activation offload, the cross-segment next-token loss);
- `stream.py`: `read_stream`, closed segments folded into the state, the open one handed back (`MemoryModel.step`);
- `packing.py`: padded batches as per-row token streams (tensor layout only);
- `open_segment.py`: generation's reading: whole segments folded into memory, the open segment extended token by
  token through the backbone's cache;
- `generation.py`: `MemoryGenerationCache`, the cache HF `generate` carries (per group of rows, the memory state of
  closed segments and the open segment; it computes nothing itself);
- `offload.py`: per-segment activation offload to CPU.
"""

from .segments import (
    IGNORE_INDEX,
    MEMORY_KWARG,
    RunResult,
    SegmentRuntime,
    keep_rows,
    resolve_keep_logits,
    segment_spans,
    shift_targets,
    supervised_segments,
)

__all__ = [
    "IGNORE_INDEX",
    "MEMORY_KWARG",
    "RunResult",
    "SegmentRuntime",
    "keep_rows",
    "resolve_keep_logits",
    "segment_spans",
    "shift_targets",
    "supervised_segments",
]
