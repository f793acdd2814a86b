"""Config dataclasses: JSON round trip, unknown fields and out-of-range values rejected with clear errors."""

from __future__ import annotations

import json

import pytest

import hmt_adapters as ha
from hmt_adapters.registry import get_method


@pytest.mark.parametrize("method", ha.available_methods())
def test_every_config_round_trips_through_json(method, tmp_path):
    config = get_method(method).make_config(method, segment_length=16, bptt_depth=3)
    path = config.save(tmp_path, base_model_name_or_path="some/model")
    data = json.loads(path and open(path).read())
    assert data["method"] == method == config.method and data["base_model_name_or_path"] == "some/model"
    assert ha.MemoryConfig.from_json_file(path) == config
    assert ha.MemoryConfig.from_dict(config.to_dict()) == config


def test_every_config_names_its_method_in_one_attribute():
    """`config.method` is the method string for every class, presets included (UniMem's was "" before)."""
    assert ha.UniMemConfig().method == "transformer_xl" and ha.UniMemConfig(preset="unimix").method == "unimix"
    assert ha.TRAMSConfig().method == "trams" and ha.InfLLMConfig().method == "infllm"
    assert ha.HMTConfig().method == ha.HMTConfig.method == "hmt"
    with pytest.warns(FutureWarning, match="use `config.method`"):
        assert ha.UniMemConfig(preset="trams").method_name == "trams"


def test_config_objects_and_method_strings_build_the_same_model():
    assert get_method("hmt").make_config("hmt", segment_length=64) == ha.HMTConfig(segment_length=64)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(segment_length=0), r"`segment_length` must be in \[1, inf\], got 0"),
        (dict(segment_length=8.5), r"`segment_length` must be an integer in \[1, inf\], got 8.5"),
        (dict(bptt_depth=0), r"`bptt_depth` must be in \[1, inf\], got 0"),
        (dict(offload_activations="yes"), r"`offload_activations` must be a bool, got 'yes'"),
        (dict(sensory_length=-1), r"`sensory_length` must be in \[0, inf\], got -1"),
        (dict(memory_window=0), r"`memory_window` must be in \[1, inf\], got 0"),
        (
            dict(query_source="future"),
            r"`query_source` must be one of \['previous_suffix', 'segment_prefix'\], got 'future'",
        ),
        (dict(segment_length=8, summary_length=9), r"`summary_length` must be in \[1, `segment_length`=8\], got 9"),
        (dict(segment_length=None), r"`segment_length` must not be None in \[1, inf\]"),
    ],
)
def test_out_of_range_values_name_the_field_the_value_and_the_range(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ha.HMTConfig(**kwargs)


def test_unknown_fields_are_rejected_with_the_valid_ones_listed(tmp_path):
    with pytest.raises(ValueError, match=r"Unknown field\(s\) \['num_sensory'\] for method 'hmt'.*valid fields"):
        get_method("hmt").make_config("hmt", num_sensory=4)
    path = tmp_path / "memory_config.json"
    path.write_text(json.dumps({"method": "rmt", "segment_length": 8, "memory_size": 3}))
    with pytest.raises(ValueError, match=r"Unknown field\(s\) \['memory_size'\]"):
        ha.MemoryConfig.from_json_file(path)
    with pytest.raises(ValueError, match=r"Unknown field\(s\) \['sensory'\] for HMTConfig"):
        ha.HMTConfig().replace(sensory=3)


def test_unknown_method_names_list_the_available_ones(tmp_path):
    with pytest.raises(ValueError, match=r"Unknown memory method 'hmtt'; available methods: \["):
        get_method("hmtt")
    path = tmp_path / "memory_config.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        ha.MemoryConfig.from_json_file(path)


def test_registering_a_method_twice_is_an_error():
    with pytest.raises(KeyError, match="already a memory method called 'hmt'"):
        ha.register_method("hmt", ha.HMTConfig, get_method("hmt").method_cls)
