"""One package per memory method; importing this package registers them all."""

from . import hmt, rmt  # noqa: F401  (registration side effect)
