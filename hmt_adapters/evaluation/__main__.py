"""lm-eval's command line with the `hmt-adapters` model type registered: `python -m hmt_adapters.evaluation --model
hmt-adapters --model_args pretrained=smollm2,adapter=PATH --tasks ... --include_path DIR`."""

from lm_eval.__main__ import cli_evaluate

from . import harness  # noqa: F401  (registers the model type)

if __name__ == "__main__":
    cli_evaluate()
