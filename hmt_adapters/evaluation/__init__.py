"""Long-context evaluation: passkey, RULER needles and variable tracking, BABILong-style QA and book perplexity over
real-text haystacks, for memory models and their bare-backbone baselines; corpus NLL and perplexity in `.nll` (also
named by `hmt_adapters.training`); lm-eval integration in `.harness` (imported on its own: it needs the `eval`
extra)."""

from .haystack import HAYSTACKS, Haystack, load_haystack
from .runner import Reader, accuracy_table, answer_rows, book_nll, book_perplexity, retrieval_recall
from .samples import Insert, Sample, build_sample
from .scoring import METRICS, score
from .shared_prefix import SharedPrefixes
from .tasks import TASKS, make_samples

__all__ = [
    "HAYSTACKS",
    "Haystack",
    "Insert",
    "METRICS",
    "Reader",
    "Sample",
    "TASKS",
    "accuracy_table",
    "answer_rows",
    "SharedPrefixes",
    "book_nll",
    "book_perplexity",
    "build_sample",
    "load_haystack",
    "make_samples",
    "retrieval_recall",
    "score",
]
