"""`examples/train_longcontext.py`: every registered method trains through the recipe, its options pass through,
bad names fail clearly, and evaluation samples put the needle at the depths asked."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import hmt_adapters as ha
from hmt_adapters.evaluation import TASKS, load_haystack, tasks
from hmt_adapters.evaluation.tasks import PASSKEY_HEAD
from tiny import tiny_llama, tiny_tokenizer

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "train_longcontext.py"
spec = importlib.util.spec_from_file_location("train_longcontext", SCRIPT)
recipe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(recipe)

SEGMENT = 32
SMALL = {"elastic": {"hippo_order": 16}}  # its default (540 Legendre coefficients, as many memory tokens) is slow here


def passkey_batch(size: int = 2, segments: int = 6, depths: list[float] | None = None):
    return recipe.batch("passkey", tiny_tokenizer(), segments * SEGMENT, size, 1, "repeat", depths)


@pytest.mark.parametrize("method", ha.available_methods())
def test_every_registered_method_trains_one_step(method):
    model = recipe.build_model(tiny_llama(len(tiny_tokenizer())), method, SEGMENT, 6, SMALL.get(method))
    assert model.memory_config.method == method and model.memory_config.segment_length == SEGMENT
    params = [p for p in model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    data, _ = passkey_batch()
    loss = model(**data).loss
    loss.backward()
    torch.optim.SGD(params, lr=0.1).step()
    assert torch.isfinite(loss)
    assert any(not torch.equal(a, p) for a, p in zip(before, params))
    model.eval()
    hits, mask, nll = recipe.answer_hits(model, data, chunk=SEGMENT)  # streamed evaluation: the forward's answer loss
    answer = data["labels"][0] != recipe.IGNORE
    assert hits.shape == (2, answer.sum())
    with torch.no_grad():
        assert torch.allclose(nll.mean(), model(**data).loss, atol=1e-4)


def test_method_options_pass_through_and_override_the_recipe():
    base = tiny_llama(len(tiny_tokenizer()))
    model = recipe.build_model(base, "rmt", SEGMENT, 4, recipe.parse_method_options(["num_memory_tokens=3"]))
    assert model.memory_config.num_memory_tokens == 3  # the recipe's 8, overridden
    hmt = recipe.build_model(tiny_llama(len(tiny_tokenizer())), "hmt", SEGMENT, 1024)
    assert hmt.memory_config.memory_window == 1024  # the recipe keeps every segment of the longest run retrievable
    xl = recipe.build_model(
        tiny_llama(len(tiny_tokenizer())),
        "transformer_xl",
        SEGMENT,
        4,
        recipe.parse_method_options(["detach_memory=False", "memory_size=64"]),
    )
    assert xl.memory_config.detach_memory is False and xl.memory_config.memory_size == 64


def test_parse_method_options_reads_literals_and_rejects_malformed_pairs():
    options = recipe.parse_method_options(["a=8", "b=0.5", "c=False", "d=[1, 2]", "e=mean", "f=None"])
    assert options == {"a": 8, "b": 0.5, "c": False, "d": [1, 2], "e": "mean", "f": None}
    with pytest.raises(ValueError, match="key=value.*'num_memory_tokens'"):
        recipe.parse_method_options(["num_memory_tokens"])


def test_unknown_method_or_field_errors_name_the_allowed_ones(capsys):
    base = tiny_llama(len(tiny_tokenizer()))
    with pytest.raises(ValueError, match=r"Unknown --method 'nope'.*'rmt'"):
        recipe.build_model(base, "nope", SEGMENT, 4)
    with pytest.raises(SystemExit):
        recipe.parse_args(["--method", "nope"])
    err = capsys.readouterr().err
    assert "invalid choice: 'nope'" in err and all(m in err for m in ha.available_methods())
    with pytest.raises(ValueError, match=r"Unknown field\(s\) \['nope'\].*num_memory_tokens"):
        recipe.build_model(base, "rmt", SEGMENT, 4, {"nope": 1})
    with pytest.raises(ValueError, match="--segment-length"):
        recipe.build_model(base, "rmt", SEGMENT, 4, {"segment_length": 8})


def test_eval_samples_put_the_needle_at_the_depths_asked():
    assert recipe.eval_depths(5) == [0.0, 0.25, 0.5, 0.75, 1.0] and recipe.eval_depths(1) == [0.5]
    with pytest.raises(ValueError, match="at least one"):
        recipe.eval_depths(0)
    tok = tiny_tokenizer()
    length = 16 * SEGMENT
    data, positions = recipe.batch("passkey", tok, length, 5, 3, "repeat", recipe.eval_depths(5))
    answer = int((data["labels"][0] != recipe.IGNORE).sum())
    prompt = length - answer
    head = len(tok(PASSKEY_HEAD, add_special_tokens=False)["input_ids"])
    needle = len(tok(" The pass key is 12345. Remember it.", add_special_tokens=False)["input_ids"])
    question = len(tok("\nWhat is the pass key? The pass key is", add_special_tokens=False)["input_ids"])
    filler = prompt - head - needle - question
    sentence = max(len(p) for p in load_haystack("repeat", tok).pieces)
    for depth, position in zip(recipe.eval_depths(5), positions):
        assert abs(position - head - depth * filler) <= sentence
    assert positions[0] == head and positions[-1] == prompt - question - needle  # both ends of the haystack
    labels = data["labels"]
    assert (labels[:, :prompt] == recipe.IGNORE).all() and (labels[:, prompt:] == data["input_ids"][:, prompt:]).all()


@pytest.mark.parametrize("segments", [5, 6, 9])
def test_the_question_and_its_answer_end_inside_the_last_segment(segments):
    """A sample of n whole segments is exactly n segments long: the answer does not open a segment of its own, and
    the question's last words share the answer's window (the layout the RMT reference keeps)."""
    tok = tiny_tokenizer()
    data, _ = recipe.batch("passkey", tok, segments * SEGMENT, 3, 5, "repeat")
    ids, labels = data["input_ids"], data["labels"]
    assert ids.shape == (3, segments * SEGMENT)
    answer = (labels != recipe.IGNORE).nonzero()[:, 1]
    assert int(answer.min()) >= (segments - 1) * SEGMENT  # every answer token in the last segment
    question = tok("\nWhat is the pass key? The pass key is", add_special_tokens=False)["input_ids"]
    start = int(answer.min()) - len(question)
    assert ids[0, start : int(answer.min())].tolist() == question and start >= (segments - 1) * SEGMENT - len(question)
    assert recipe.no_information_nll("passkey", 6) == pytest.approx(math.log(90_000) / 6)  # 1.90: ' ' + 5 digits


def test_train_batch_size_caps_tokens_per_step():
    assert recipe.train_batch_size(32, 4096, 128) == 32
    assert recipe.train_batch_size(32, 4096, 1024) == 4
    assert recipe.train_batch_size(32, 4096, 8192) == 1


def test_main_writes_a_report_with_accuracy_per_length_and_depth(tmp_path):
    report = recipe.main(
        [
            "--width",
            "32",
            "--max-steps",
            "2",
            "--eval-every",
            "1",
            "--levels",
            "2",
            "--eval-segments",
            "3",
            "--batch-size",
            "2",
            "--eval-size",
            "2",
            "--eval-samples",
            "3",
            "--method",
            "rmt",
            "--method-option",
            "num_memory_tokens=2",
            "--output",
            str(tmp_path),
        ]
    )
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["accuracy"] == json.loads(json.dumps(report["accuracy"]))
    assert saved["method_options"] == {"num_memory_tokens": 2}
    assert [h["depth"] for h in saved["history"]] == [0.0, 0.0]  # the depth-0 stage until it passes
    row = saved["accuracy"]["3"]
    assert row["samples"] == 3 and not row["trained"] and row["tokens"] == 3 * 64
    assert [s["depth"] for s in row["per_sample"]] == [0.0, 0.5, 1.0]
    assert row["correct"] == sum(s["exact"] for s in row["per_sample"])
    alone = row["memory_disabled"]  # the same prompts with memory disabled, each segment alone
    assert alone["samples"] == 3 and len(alone["per_sample"]) == 3 and 0 <= alone["correct"] <= 3
    assert saved["provenance"]["git_commit"]
    # --init-from reloads the trained backbone, tokenizer and adapter: with no further step, the same answers
    again = recipe.main(
        [
            "--init-from",
            str(tmp_path),
            "--max-steps",
            "0",
            "--levels",
            "2",
            "--eval-segments",
            "3",
            "--eval-samples",
            "3",
            "--eval-size",
            "2",
            "--output",
            str(tmp_path / "again"),
        ]
    )
    for n in ("2", "3"):
        assert again["accuracy"][n]["answer_nll"] == pytest.approx(report["accuracy"][n]["answer_nll"], abs=1e-5)
    assert again["steps"] == 0


def test_init_from_keeps_lora_trainable_on_a_frozen_backbone(tmp_path):
    from hmt_adapters.training import add_lora

    model = recipe.build_model(
        add_lora(tiny_llama(len(tiny_tokenizer()))), "rmt", SEGMENT, 4, None, freeze_backbone=True
    )
    model.save_pretrained(tmp_path)
    loaded = recipe.load_for_training(add_lora(tiny_llama(len(tiny_tokenizer()))), str(tmp_path), freeze_backbone=True)
    trainable = {n for n, p in loaded.named_parameters() if p.requires_grad}
    assert any("lora_" in n for n in trainable) and any(n.startswith("memory.") for n in trainable)
    assert all("lora_" in n or n.startswith("memory.") for n in trainable)  # the backbone's own weights stay frozen


def test_max_minutes_stops_training_then_saves_and_evaluates(tmp_path):
    report = recipe.main(
        [
            "--width",
            "32",
            "--max-steps",
            "50",
            "--max-minutes",
            "0",
            "--levels",
            "2",
            "--eval-segments",
            "3",
            "--batch-size",
            "2",
            "--eval-size",
            "2",
            "--eval-samples",
            "2",
            "--output",
            str(tmp_path),
        ]
    )
    assert report["steps"] == 1 and report["time_limit_reached"]
    assert (tmp_path / "adapter" / "memory_config.json").exists() and set(report["accuracy"]) == {"2", "3"}


def test_a_sanity_segment_too_short_for_the_task_says_which_flags_fix_it(tmp_path):
    args = ["--width", "32", "--max-steps", "1", "--levels", "2", "--eval-segments", "2", "--task", "passkey_update"]
    args += ["--segment-length", "64", "--batch-size", "1", "--eval-size", "1", "--eval-samples", "1"]
    with pytest.raises(
        ValueError,
        match=r"--segment-length 64 tokens, too short for --task passkey_update.*"
        r"at least \d+.*Use a longer --segment-length or --no-sanity-stage",
    ):
        recipe.main([*args, "--sanity-stage", "--output", str(tmp_path)])


def test_eval_chunk_bounds_the_logits_of_a_step():
    assert recipe.eval_chunk(32, 64, 512) == 32 * 64  # the tiny recipe: 32 segments per step, as before
    assert recipe.eval_chunk(32, 256, 49152) == 256  # SmolLM2: one segment (1.6 GB of logits, not 52 GB)
    assert recipe.eval_chunk(4, 256, 49152) == 5 * 256  # 1.0 GB


def test_the_sanity_stage_comes_first_and_every_loss_is_read_against_no_information(tmp_path):
    args = ["--width", "32", "--max-steps", "1", "--eval-every", "1", "--levels", "2", "--eval-segments", "2"]
    args += ["--segment-length", "160", "--batch-size", "1", "--eval-size", "1", "--eval-samples", "1"]
    report = recipe.main([*args, "--sanity-stage", "--warmup-depth", "none", "--output", str(tmp_path)])
    assert report["no_information_nll"] == pytest.approx(math.log(90_000) / 6)
    (first,) = report["history"]
    assert first["segments"] == 1  # needle, question and answer in one window
    assert first["loss_over_no_information"] == pytest.approx(first["loss"] / report["no_information_nll"])
    assert report["accuracy"]["2"]["no_information_nll"] == report["no_information_nll"]


def test_a_run_killed_after_an_evaluation_resumes_to_the_uninterrupted_weights(tmp_path):
    """Every evaluation checkpoints the adapter, the optimizer and the curriculum position; `--resume` continues from
    there: 2 steps, a kill, 2 more == 4 steps straight (the batches and revisits are chosen by step)."""
    args = ["--width", "32", "--eval-every", "2", "--levels", "2", "4", "--eval-segments", "2", "--advance-at", "0"]
    args += ["--batch-size", "2", "--eval-size", "2", "--eval-samples", "1", "--method", "rmt"]
    args += ["--method-option", "num_memory_tokens=2"]
    straight = recipe.main([*args, "--max-steps", "4", "--output", str(tmp_path / "straight")])
    recipe.main([*args, "--max-steps", "2", "--output", str(tmp_path / "killed")])
    progress = json.loads((tmp_path / "killed" / "checkpoint" / "progress.json").read_text())
    assert progress["step"] == 2 and len(progress["history"]) == 1
    resumed = recipe.main([*args, "--max-steps", "4", "--resume", "--output", str(tmp_path / "killed")])
    assert [h["step"] for h in resumed["history"]] == [h["step"] for h in straight["history"]] == [2, 4]
    assert [h["loss"] for h in resumed["history"]] == pytest.approx([h["loss"] for h in straight["history"]], abs=1e-6)
    weights = [load_file(tmp_path / run / "adapter" / "memory_adapter.safetensors") for run in ("straight", "killed")]
    for key in weights[0]:
        torch.testing.assert_close(weights[1][key], weights[0][key], atol=1e-6, rtol=1e-5)


def test_accumulation_fills_the_batch_with_micro_batches_of_at_most_batch_tokens():
    assert recipe.micro_batches(32, 4096, 1024, accumulate=False) == [4]  # the tiny recipe: the batch shrinks
    assert recipe.micro_batches(32, 4096, 1024, accumulate=True) == [4] * 8  # the anchors' batch of 32
    assert recipe.micro_batches(10, 4096, 1024, accumulate=True) == [4, 4, 2]
    assert recipe.micro_batches(4, 4096, 256, accumulate=True) == [4]


def test_warmup_rises_linearly_then_holds():
    assert [recipe.warmup_factor(s, 4) for s in (1, 2, 4, 9)] == [0.25, 0.5, 1.0, 1.0]
    assert recipe.warmup_factor(1, 0) == 1.0


def test_an_accumulated_step_equals_one_step_on_the_whole_batch(tmp_path):
    """Two micro-batches of 2 (`--batch-tokens` allows 2 samples per forward) give the weights of one batch of 4."""
    args = ["--width", "32", "--max-steps", "1", "--eval-every", "1", "--levels", "2", "--eval-segments", "2"]
    args += ["--batch-size", "4", "--eval-size", "1", "--eval-samples", "1", "--method", "rmt", "--lr", "1e-2"]
    args += ["--method-option", "num_memory_tokens=2", "--no-memory-disabled-baseline"]
    whole = recipe.main([*args, "--batch-tokens", "512", "--output", str(tmp_path / "whole")])
    parts = recipe.main([*args, "--batch-tokens", "256", "--accumulate", "--output", str(tmp_path / "parts")])
    assert parts["history"][0]["loss"] == pytest.approx(whole["history"][0]["loss"], abs=1e-5)
    weights = [load_file(tmp_path / run / "adapter" / "memory_adapter.safetensors") for run in ("whole", "parts")]
    for key in weights[0]:
        torch.testing.assert_close(weights[1][key], weights[0][key], atol=1e-5, rtol=1e-4)
    assert (tmp_path / "parts" / "curves.png").stat().st_size > 0  # the learning curves beside the report


def test_warmup_scales_the_first_steps_learning_rate(tmp_path):
    """With --warmup-steps 2 the first step moves the weights half as far as without (Adam's first step is
    lr-sized)."""
    args = ["--width", "32", "--max-steps", "1", "--eval-every", "1", "--levels", "2", "--eval-segments", "2"]
    args += ["--batch-size", "2", "--eval-size", "1", "--eval-samples", "1", "--method", "rmt", "--lr", "1e-2"]
    args += ["--method-option", "num_memory_tokens=2", "--no-memory-disabled-baseline", "--init-from"]
    init = tmp_path / "init"
    recipe.main([*args[:-1], "--max-steps", "0", "--output", str(init)])
    start = load_file(init / "adapter" / "memory_adapter.safetensors")
    moved = {}
    for warmup in ("0", "2"):
        recipe.main([*args, str(init), "--warmup-steps", warmup, "--output", str(tmp_path / warmup)])
        after = load_file(tmp_path / warmup / "adapter" / "memory_adapter.safetensors")
        moved[warmup] = max(float((after[k] - start[k]).abs().max()) for k in start)
    assert moved["2"] == pytest.approx(moved["0"] / 2, rel=0.05)


def babi_batch(size: int = 6, segments: int = 12):
    """A qa2 batch whose answers differ in length (the first seed where they do)."""
    for seed in range(50):
        data, positions = recipe.batch("qa2", tiny_tokenizer(), segments * SEGMENT, size, seed, "repeat")
        lengths = (data["labels"] != recipe.IGNORE).sum(-1)
        if len(set(lengths.tolist())) > 1:
            return data, positions
    raise AssertionError("no qa2 batch with answers of unequal length in 50 seeds")


def test_babi_samples_leave_room_for_answers_of_unequal_length():
    tok, length = tiny_tokenizer(), 12 * SEGMENT  # the tiny BPE spends ~280 tokens on a story's facts
    data, positions = babi_batch()
    ids, labels = data["input_ids"], data["labels"]
    assert ids.shape == (6, length)  # every row exactly the length asked, whatever its answer's tokens
    for row, label, position in zip(ids, labels, positions):
        answer = (label != recipe.IGNORE).nonzero()[:, 0]
        assert answer.tolist() == list(range(int(answer[0]), length))  # the answer ends the row
        assert tok.decode(row[answer]).strip() in tasks.LOCATIONS and int(answer[0]) >= 11 * SEGMENT
        assert 0 < position < int(answer[0])  # the earliest supporting fact, before the question
    with pytest.raises(ValueError, match="qa2 places its facts at random depths"):
        recipe.batch("qa2", tok, length, 2, 0, "repeat", [0.0, 1.0])
    assert recipe.no_information_nll("qa2", 1.5) == pytest.approx(math.log(6) / 1.5)  # six locations


def test_updated_passkey_batches_answer_the_current_key_and_point_at_its_statement():
    """`--task passkey_update`: each row ends in the last key set, the evidence position is that statement's (not
    the first key's), and the loss is read against ln(50,000) per answer token."""
    tok, length = tiny_tokenizer(), 12 * SEGMENT
    data, positions = recipe.batch("passkey_update", tok, length, 4, 0, "repeat")
    assert data["input_ids"].shape == (4, length)
    for i, (label, position) in enumerate(zip(data["labels"], positions)):
        sample = TASKS["passkey_update"](tok, length, seed=i, haystack="repeat")  # seed 0 * 100_003 + i
        answer = tok.decode(label[label != recipe.IGNORE]).strip()
        assert answer not in sample.extra["stale"] and answer.isdigit()
        prompt = TASKS["passkey_update"](tok, length - len(tok(" " + answer)["input_ids"]), seed=i, haystack="repeat")
        assert answer == prompt.answers[0] and position == prompt.inserts[-1].position > prompt.inserts[0].position
    assert recipe.no_information_nll("passkey_update", 5.8) == pytest.approx(math.log(50_000) / 5.8)


def test_task_options_reach_the_generator_and_unknown_ones_name_those_it_takes():
    """`--task-option updates=6 --task-option keep_clear=64`: the batch's prompts are the generator's with those
    keywords (six statements, none in the last segment: only memory holds the keys); a keyword the generator lacks
    is an error naming the ones it takes, not dropped."""
    tok, length = tiny_tokenizer(), 32 * SEGMENT
    options = recipe.parse_task_options("passkey_update", ["updates=6", f"keep_clear={2 * SEGMENT}"])
    assert options == {"updates": 6, "keep_clear": 2 * SEGMENT}
    data, positions = recipe.batch("passkey_update", tok, length, 3, 0, "repeat", options=options)
    for i, (row, label, position) in enumerate(zip(data["input_ids"], data["labels"], positions)):
        answer = label[label != recipe.IGNORE]
        prompt = TASKS["passkey_update"](tok, length - len(answer), seed=i, haystack="repeat", **options)
        assert row[: len(prompt.input_ids)].tolist() == prompt.input_ids and len(prompt.extra["stale"]) == 5
        last = prompt.inserts[-1]
        assert position == last.position and last.position + last.num_tokens <= length - 2 * SEGMENT
    with pytest.raises(ValueError, match=r"\['update'\] is not a keyword of --task passkey_update.*'updates'"):
        recipe.parse_task_options("passkey_update", ["update=6"])
    with pytest.raises(ValueError, match=r"\['updates'\] is not a keyword of --task passkey; it takes \['question'\]"):
        recipe.parse_task_options("passkey", ["updates=6"])


def test_answer_hits_score_each_answer_over_its_own_tokens():
    """With answers of unequal length in one batch, each sample's NLL and exact match cover its own answer tokens:
    the NLL equals that sample's forward loss alone."""
    data, _ = babi_batch()
    model = recipe.build_model(tiny_llama(len(tiny_tokenizer())), "rmt", SEGMENT, 12).eval()
    hits, mask, nll = recipe.answer_hits(model, data, chunk=SEGMENT)
    lengths = (data["labels"] != recipe.IGNORE).sum(-1)
    assert mask.sum(-1).tolist() == lengths.tolist() and bool(hits[~mask].all())
    with torch.no_grad():
        alone = [float(model(**{k: v[i : i + 1] for k, v in data.items()}).loss) for i in range(len(lengths))]
    assert nll.tolist() == pytest.approx(alone, abs=1e-4)
    summary = recipe.answer_summary(hits, mask, nll, [None] * len(lengths), list(range(len(lengths))))
    assert summary["answer_token_accuracy"] == pytest.approx(float(hits[mask].float().mean()))


def test_answer_hits_in_groups_equal_one_batch():
    """A reader evaluated a few samples at a time (answers of unequal length in different groups) scores as the
    whole batch at once: the same hits, mask and NLL, aligned on the answers' ends."""
    data, _ = babi_batch()
    assert len({int(n) for n in (data["labels"] != recipe.IGNORE).sum(-1)}) > 1  # unequal answers
    model = recipe.build_model(tiny_llama(len(tiny_tokenizer())), "rmt", SEGMENT, 12).eval()
    whole = recipe.answer_hits(model, data, chunk=SEGMENT)
    for group in (1, 3):
        grouped = recipe.answer_hits(model, data, chunk=SEGMENT, group=group)
        assert torch.equal(grouped[0], whole[0]) and torch.equal(grouped[1], whole[1])
        assert torch.allclose(grouped[2], whole[2], atol=1e-5)


def test_the_warmup_depth_stage_is_for_needle_tasks_only():
    assert recipe.warmup_depth("passkey", "auto") == 0.0 and recipe.warmup_depth("passkey", 0.5) == 0.5
    assert recipe.warmup_depth("qa2", "auto") is None and recipe.warmup_depth("passkey", "none") is None
    with pytest.raises(ValueError, match=r"--warmup-depth 0.5 needs a needle task.*qa2 has none"):
        recipe.warmup_depth("qa2", 0.5)
    with pytest.raises(ValueError, match="--model tiny is trained from scratch"):
        recipe.main(["--reader-baseline", "infllm", "--max-steps", "1"])


def test_reader_segments_must_be_evaluated_lengths_of_a_reader():
    """`--reader-segments` limits the training-free readers to some evaluated lengths; any other count, or no reader
    to limit, is an error naming what is allowed."""
    base = ["--levels", "2", "4", "--eval-segments", "16", "64"]
    recipe.check_reader_segments(
        recipe.parse_args([*base, "--reader-baseline", "infllm", "--reader-segments", "4", "64"])
    )
    with pytest.raises(
        ValueError, match=r"--reader-segments \[8\]: each must be an evaluated length, one of \[2, 4, 16, 64\]"
    ):
        recipe.check_reader_segments(
            recipe.parse_args([*base, "--reader-baseline", "infllm", "--reader-segments", "8"])
        )
    with pytest.raises(ValueError, match="--reader-segments chooses where the --reader-baseline readers run"):
        recipe.main([*base, "--reader-segments", "4", "--max-steps", "1"])


def test_full_attention_reader_equals_the_backbone_on_the_whole_prompt():
    """The full-attention reader streamed chunk by chunk (its KV cache carried between `step` calls) scores what the
    backbone gives reading each whole prompt in one forward."""
    data, _ = babi_batch()
    backbone = tiny_llama(len(tiny_tokenizer())).eval()
    hits, mask, nll = recipe.answer_hits(recipe.FullAttention(backbone), data, chunk=SEGMENT, group=2)
    with torch.no_grad():
        logits = backbone(input_ids=data["input_ids"]).logits[:, :-1]
    target, answer = data["input_ids"][:, 1:], (data["labels"] != recipe.IGNORE)[:, 1:]
    whole = (logits.argmax(-1) == target) | ~answer
    assert hits.all(-1).tolist() == whole.all(-1).tolist()
    alone = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target, reduction="none")
    assert nll.tolist() == pytest.approx(((alone * answer).sum(-1) / answer.sum(-1)).tolist(), abs=1e-4)


def test_memory_disabled_reads_the_last_segment_alone_to_the_same_answers():
    """Each segment is read alone with memory disabled, so the answers (question and answer in the last segment) come
    out the same from that segment alone; an answer token before it keeps the whole prompt."""
    data, _ = passkey_batch(size=3, depths=[0.0, 0.5, 1.0])
    model = recipe.build_model(tiny_llama(len(tiny_tokenizer())), "rmt", SEGMENT, 6).eval()
    view = recipe.alone_view(data, SEGMENT)
    assert view["input_ids"].shape[1] == SEGMENT
    with model.disable_memory():
        whole, alone = recipe.answer_hits(model, data, SEGMENT), recipe.answer_hits(model, view, SEGMENT)
    assert torch.equal(whole[0], alone[0]) and torch.equal(whole[1], alone[1])
    torch.testing.assert_close(whole[2], alone[2], atol=1e-5, rtol=1e-5)
    early = {**data, "labels": data["labels"].clone()}
    early["labels"][:, 0] = early["input_ids"][:, 0]
    assert recipe.alone_view(early, SEGMENT) is early


def test_resuming_a_finished_run_trains_no_further_and_evaluates_only_what_it_lacks(tmp_path):
    args = ["--width", "32", "--max-steps", "2", "--eval-every", "1", "--levels", "2", "--batch-size", "2"]
    args += ["--eval-size", "2", "--eval-samples", "3", "--output", str(tmp_path)]
    first = recipe.main([*args, "--eval-segments", "3"])
    weights = (tmp_path / "adapter" / "memory_adapter.safetensors").read_bytes()
    saved = json.loads((tmp_path / "report.json").read_text())
    del saved["accuracy"]["3"]  # as if killed before this length: it is measured again, with the final adapter
    (tmp_path / "report.json").write_text(json.dumps(saved))
    again = recipe.main([*args, "--eval-segments", "3", "4", "--resume"])
    assert again["steps"] == first["steps"] == 2 and again["history"] == json.loads(json.dumps(first["history"]))
    assert (tmp_path / "adapter" / "memory_adapter.safetensors").read_bytes() == weights
    assert again["accuracy"]["2"] == json.loads(json.dumps(first["accuracy"]["2"]))  # kept, not measured again
    assert again["accuracy"]["3"]["answer_nll"] == pytest.approx(first["accuracy"]["3"]["answer_nll"], abs=1e-5)
    assert again["accuracy"]["3"]["memory_disabled"]["correct"] == first["accuracy"]["3"]["memory_disabled"]["correct"]
    assert set(again["accuracy"]) == {"2", "3", "4"} and again["accuracy"]["4"]["samples"] == 3
