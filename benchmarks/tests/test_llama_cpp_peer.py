"""benchmarks/llama_cpp_peer.py: llama.cpp readers for benchmarks/infllm.py (llama-cpp-python is not in the lock, so
the reader's greedy loop runs here against a stand-in for `llama_cpp.Llama`)."""

from __future__ import annotations

import builtins
import sys

import pytest

import infllm
import llama_cpp_peer


class FakeLlama:
    """`llama_cpp.Llama`'s surface the reader uses: `generate` yields token ids, `token_eos`, `close`."""

    def __init__(self, stream: list[int], eos: int = 2) -> None:
        self.stream, self.eos, self.calls, self.closed = stream, eos, [], False

    def generate(self, tokens, temp, reset):
        self.calls.append((list(tokens), temp, reset))
        yield from self.stream

    def token_eos(self) -> int:
        return self.eos

    def close(self) -> None:
        self.closed = True


def test_reader_is_greedy_from_a_reset_cache_and_stops_at_max_new_tokens_or_eos():
    model = FakeLlama([5, 6, 7, 8, 9])
    reader = llama_cpp_peer.LlamaCppReader("llama_cpp", model)
    assert reader.generate((1, 3, 4), 3, pad_token_id=0) == [5, 6, 7]
    assert model.calls == [([1, 3, 4], 0.0, True)]  # greedy (temp 0), no prefix reused from the last prompt
    assert llama_cpp_peer.LlamaCppReader("r", FakeLlama([5, 2, 7])).generate([1], 8, 0) == [5, 2]  # eos kept,
    # as transformers' `generate` returns it (skip_special_tokens drops it when decoding)
    reader.close()
    assert model.closed


def test_without_llama_cpp_python_the_error_says_how_to_install_it(monkeypatch):
    real_import = builtins.__import__

    def no_llama(name, *args, **kwargs):
        if name == "llama_cpp":
            raise ImportError("No module named 'llama_cpp'")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "llama_cpp", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_llama)
    with pytest.raises(SystemExit, match=r"pip install llama-cpp-python==0\.3\.36 diskcache"):
        llama_cpp_peer.load_llama(1024, 1)
    with pytest.raises(ValueError, match=r"reader 'llama': expected one of \('llama_cpp', 'llama_cpp_yarn'\)"):
        llama_cpp_peer.llama_cpp_reader("llama", 1024, 8192, 1)


def test_infllm_script_refuses_llama_cpp_readers_off_smollm2(monkeypatch, tmp_path):
    out = tmp_path / "r.jsonl"
    argv = ["infllm.py", "--readers", "llama_cpp", "--model", "some/path", "--out", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit, match="need --model smollm2 and --device cpu, got --model some/path"):
        infllm.main()
    assert not out.exists()


def test_cpu_rate_is_process_seconds_per_1k_tokens(monkeypatch):
    clock = iter([10.0, 12.5])
    monkeypatch.setattr(llama_cpp_peer.time, "process_time", lambda: next(clock))
    assert llama_cpp_peer.cpu_rate(lambda: 500)() == pytest.approx(5.0)  # 2.5 s for 500 tokens


def test_the_build_is_recorded_as_llama_cpp_reports_it(monkeypatch):
    class Module:
        __version__ = "0.3.36"

        @staticmethod
        def llama_print_system_info() -> bytes:
            return b"CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 1 | \n"

    monkeypatch.setitem(sys.modules, "llama_cpp", Module)
    assert llama_cpp_peer.llama_cpp_build() == {
        "llama_cpp_python": "0.3.36",
        "system_info": "CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 1 |",
    }
