"""lm-evaluation-harness integration: evaluate any `MemoryModel` with lm-eval, and export this suite's samples as
lm-eval tasks that read local files only.

In Python (any MemoryModel instance):

    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager
    from hmt_adapters.evaluation.harness import MemoryLM, write_lm_eval_tasks
    folder = write_lm_eval_tasks("lm_eval_tasks", {"passkey_8k": samples}, tokenizer)
    simple_evaluate(model=MemoryLM(model, tokenizer=tokenizer), tasks=["hmt_passkey_8k"],
                    task_manager=TaskManager(include_path=folder, include_defaults=False))

From the command line (`hmt-adapters` is a registered lm-eval model type; backbone + adapter from `model_args`):

    python -m hmt_adapters.evaluation --model hmt-adapters \
        --model_args pretrained=smollm2,adapter=examples/adapters/smollm2-hmt --tasks hmt_passkey_8k \
        --include_path lm_eval_tasks --device cpu

`MemoryLM` is lm-eval's `HFLM` with no context limit (the memory reads any length): `loglikelihood_rolling` scores a
document as one window, streamed segment by segment through memory (flat memory use); `generate_until` reads the
prompt segment by segment through `MemoryModel.generate`, so answers are generated across segment boundaries with
memory. `HFLM(pretrained=<MemoryModel>, max_length=<large>)` gives the same log-likelihoods but holds every logit.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from ..backbones.pretrained import backbone_path, load_backbone
from ..model import MemoryModel, wrap_with_memory
from ..registry import available_methods
from .nll import token_nll
from .samples import Sample
from .scoring import score

UNBOUNDED = 2**31 - 1  # lm-eval's `max_length` for a memory model: no window cuts the document or the prompt
TASK_PREFIX = "hmt_"


@register_model("hmt-adapters", "hmt_adapters")
class MemoryLM(HFLM):
    """lm-eval's `HFLM` around a `MemoryModel`: pass the instance (with `tokenizer`), or `pretrained` = a backbone
    (`"smollm2"`, a folder or a Hub id) plus either `adapter` = a saved memory adapter folder or `method` = a memory
    method wrapped without training (`method=infllm`, the training-free reader); any other keyword that is not
    `HFLM`'s own is a config field of that method or adapter (`method=infllm,window=2048`). `memory=False`
    evaluates the same model with each segment read alone (`MemoryModel.disable_memory`, the same-window
    baseline)."""

    def __init__(
        self,
        pretrained: MemoryModel | str,
        adapter: str | None = None,
        memory: bool = True,
        tokenizer: Any = None,
        max_length: int | None = None,
        device: str | None = None,
        method: str | None = None,  # after the earlier parameters: their positions are as before
        **kwargs: Any,
    ):
        own = set(inspect.signature(HFLM.__init__).parameters)
        fields = {key: kwargs.pop(key) for key in [k for k in kwargs if k not in own]}
        if isinstance(tokenizer, str):  # `tokenizer=smollm2`: the offline folder (RULER's own loader needs a path)
            tokenizer = backbone_path(tokenizer)
        if isinstance(pretrained, str):
            if (adapter is None) == (method is None):
                raise ValueError(
                    "Pass one of `adapter` (a saved memory adapter folder) or `method` (a memory method to wrap, one "
                    f"of {available_methods()}) with the backbone name `pretrained={pretrained}`"
                    + (", not both." if adapter is not None else ".")
                )
            base, loaded = load_backbone(pretrained)
            if method is not None:
                pretrained = wrap_with_memory(base, method, **fields)
            else:
                pretrained = MemoryModel.from_pretrained(base, str(adapter), **fields)
            tokenizer = tokenizer or loaded
        elif adapter is not None or method is not None or fields:
            given = [*fields, *(["adapter"] if adapter else []), *(["method"] if method else [])]
            raise ValueError(
                "`adapter`, `method` and method fields apply to a backbone name; this `pretrained` is already a "
                f"MemoryModel (got {sorted(given)})."
            )
        if not isinstance(pretrained, MemoryModel):
            raise TypeError(f"`pretrained` must be a MemoryModel or a backbone name, got {type(pretrained).__name__}.")
        if tokenizer is None:
            raise ValueError("Pass the backbone's `tokenizer` with a MemoryModel instance.")
        if device is not None:
            torch.nn.Module.to(pretrained, device)  # (transformers' typed `to` wrapper misreads the bound call)
        pretrained.eval()
        if not isinstance(memory, bool):
            raise ValueError(
                f"`memory` must be True or False (lm-eval's `memory=false` parses to False), got {memory!r}."
            )
        self.memory = memory  # applied per call (`_memory`): the model itself is never switched
        super().__init__(pretrained=pretrained, tokenizer=tokenizer, max_length=max_length or UNBOUNDED, **kwargs)

    def _memory(self) -> contextlib.AbstractContextManager:
        """`disable_memory()` around one call when `memory=False`; nothing otherwise."""
        return contextlib.nullcontext() if self.memory else self.model.disable_memory()

    def _model_call(self, *args: Any, **kwargs: Any) -> Any:
        with self._memory():
            return super()._model_call(*args, **kwargs)

    def _model_generate(self, *args: Any, **kwargs: Any) -> Any:
        with self._memory():
            return super()._model_generate(*args, **kwargs)

    def loglikelihood_rolling(self, requests: list, disable_tqdm: bool = False) -> list[float]:
        """Log-likelihood of each document (every token, the first predicted from the prefix token), streamed through
        memory one segment at a time; documents longer than `max_length` are scored in lm-eval's rolling windows."""
        out = []
        for request in tqdm(requests, desc="loglikelihood_rolling", disable=disable_tqdm):
            (text,) = request.args
            ids = [self.prefix_token_id] + self.tok_encode(text)
            if len(ids) > self.max_length:
                out.extend(super().loglikelihood_rolling([request], disable_tqdm=True))
                continue
            with self._memory():
                loglikelihood = -float(token_nll(self.model, torch.tensor(ids)).double().sum())
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), loglikelihood)
            out.append(loglikelihood)
        return out


def process_results(doc: Mapping[str, Any], results: Sequence[str]) -> dict[str, float]:
    """lm-eval `process_results` of the exported generation tasks: the suite's own exact scoring."""
    return {"score": score(doc["metric"], results[0], list(doc["answers"]))}


def task_dataset(data_file: str, **_: Any) -> Any:
    """The test split of an exported task's JSONL file (the `custom_dataset` hook of `write_lm_eval_tasks`' YAMLs)."""
    import datasets

    return datasets.load_dataset("json", data_files={"test": data_file})


HOOKS = '''"""lm-eval hooks of the tasks in this folder (written by
hmt_adapters.evaluation.harness.write_lm_eval_tasks). Data files are named relative to this folder, so it can be
moved or shared."""

import os

from hmt_adapters.evaluation.harness import process_results, task_dataset  # noqa: F401


def dataset(data_file, **metadata):
    return task_dataset(os.path.join(os.path.dirname(os.path.abspath(__file__)), data_file), **metadata)
'''


def _yaml(name: str, data_file: str, body: str) -> str:
    """A task's YAML; its data file is named relative to the folder (read by the folder's `hmt_hooks.dataset`)."""
    return (
        f"task: {TASK_PREFIX}{name}\ntag:\n  - hmt_longcontext\ncustom_dataset: !function hmt_hooks.dataset\n"
        f"dataset_kwargs:\n  data_file: {json.dumps(os.path.basename(data_file))}\ntest_split: test\n{body}"
        "metadata:\n  version: 1.0\n"
    )


def write_lm_eval_tasks(
    folder: str,
    samples: Mapping[str, Sequence[Sample]],
    tokenizer: PreTrainedTokenizerBase,
    books: Mapping[str, Sequence[str]] | None = None,
) -> str:
    """Write lm-eval tasks `hmt_<name>` into `folder` (a YAML and a JSONL file each, plus the scoring hook) and return
    `folder` for `TaskManager(include_path=...)`. The YAMLs name their data files relative to `folder` (no absolute
    paths), so the folder can be moved or shared.

    `samples`: generation tasks (prompt text = the decoded sample; lm-eval re-tokenizes it, so its length in tokens
    may differ from `Sample.length` by a few tokens at piece joins); `books`: rolling log-likelihood tasks over texts
    (word/byte perplexity, bits per byte)."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "hmt_hooks.py"), "w") as fh:
        fh.write(HOOKS)
    for name, group in samples.items():
        if not group:
            raise ValueError(f"Task {name!r} has no samples.")
        data = os.path.join(folder, f"{name}.jsonl")
        with open(data, "w") as fh:
            for s in group:
                fh.write(
                    json.dumps({"input": tokenizer.decode(s.input_ids), **s.record(), "metric": s.extra["metric"]})
                    + "\n"
                )
        max_new = max(s.extra["max_new_tokens"] for s in group)
        body = (
            'output_type: generate_until\ndoc_to_text: "{{input}}"\ndoc_to_target: "{{answers[0]}}"\n'
            "process_results: !function hmt_hooks.process_results\nmetric_list:\n  - metric: score\n"
            "    aggregation: mean\n    higher_is_better: true\ngeneration_kwargs:\n  until: []\n"
            f"  max_gen_toks: {max_new}\n  do_sample: false\n"
        )
        with open(os.path.join(folder, f"{name}.yaml"), "w") as fh:
            fh.write(_yaml(name, data, body))
    for name, texts in (books or {}).items():
        data = os.path.join(folder, f"{name}.jsonl")
        with open(data, "w") as fh:
            for text in texts:
                fh.write(json.dumps({"text": text}) + "\n")
        body = (
            'output_type: loglikelihood_rolling\ndoc_to_text: ""\ndoc_to_target: "{{text}}"\nmetric_list:\n'
            "  - metric: word_perplexity\n  - metric: byte_perplexity\n  - metric: bits_per_byte\n"
        )
        with open(os.path.join(folder, f"{name}.yaml"), "w") as fh:
            fh.write(_yaml(name, data, body))
    return folder
