"""ckptd.mindspore.load_rank against a stand-in `mindspore` module that records its calls
(MindSpore itself cannot be installed here), fetching from a real ckptd."""

import sys
import types

import numpy as np
import pytest

import ckptd
import ckptd.mindspore
from ckptd import dtypes


class FakeMindSpore:
    """The few names load_rank uses: Tensor, Parameter, bfloat16, load_param_into_net and
    communication.get_rank. Records what it is given."""

    def __init__(self, rank=None):
        self.bfloat16 = object()
        self.loaded = []
        fake = self

        class Tensor:
            def __init__(self, input_data, dtype=None):
                self.array = input_data
                self.dtype = dtype

        class Parameter:
            def __init__(self, default_input, name):
                self.tensor = default_input
                self.name = name

        def load_param_into_net(net, parameter_dict, strict_load=False):
            fake.loaded.append((net, parameter_dict, strict_load))
            return ["net.only.param"]

        def get_rank():
            if rank is None:
                raise RuntimeError("init() has not been called")
            return rank

        self.module = types.ModuleType("mindspore")
        self.module.Tensor = Tensor
        self.module.Parameter = Parameter
        self.module.bfloat16 = self.bfloat16
        self.module.load_param_into_net = load_param_into_net
        self.communication = types.ModuleType("mindspore.communication")
        self.communication.get_rank = get_rank
        self.module.communication = self.communication

    def install(self, monkeypatch):
        monkeypatch.setitem(sys.modules, "mindspore", self.module)
        monkeypatch.setitem(sys.modules, "mindspore.communication", self.communication)
        return self


def test_load_rank_wraps_the_fetched_rank_and_loads_it(demo, client, monkeypatch):
    fake = FakeMindSpore(rank=2).install(monkeypatch)
    monkeypatch.delenv("RANK_ID", raising=False)
    net = object()
    result = ckptd.mindspore.load_rank(net, client, "demo", "d3", strict_load=True)
    assert result == ["net.only.param"]
    [(loaded_net, params, strict)] = fake.loaded
    assert loaded_net is net and strict is True
    expected = client.fetch("demo", "d3", 2)  # get_rank() said 2
    assert list(params) == list(expected)
    for name, parameter in params.items():
        assert parameter.name == name
        dtype = expected.info[name].dtype
        if dtype == "BFloat16":
            assert parameter.tensor.dtype is fake.bfloat16
            assert parameter.tensor.array.dtype == np.float32
            assert np.array_equal(parameter.tensor.array.view(np.uint32),
                                  dtypes.bfloat16_to_float32(expected[name]).view(np.uint32))
        else:
            assert parameter.tensor.dtype is None
            assert parameter.tensor.array.tobytes() == expected[name].tobytes()
            assert parameter.tensor.array.dtype == expected[name].dtype


def test_rank_comes_from_rank_id_without_mindspore_communication(demo, client, monkeypatch):
    fake = FakeMindSpore(rank=None).install(monkeypatch)
    monkeypatch.setenv("RANK_ID", "1")
    ckptd.mindspore.load_rank("net", client, "demo", "d3", include=["layers.0.*"])
    [(_, params, strict)] = fake.loaded
    assert strict is False
    expected = client.fetch("demo", "d3", 1, include=["layers.0.*"])
    assert list(params) == list(expected)
    assert all(params[n].tensor.array.tobytes() == expected[n].tobytes()
               for n in params if expected.info[n].dtype != "BFloat16")
    # An explicit rank wins over both.
    ckptd.mindspore.load_rank("net", client, "demo", "d3", rank=0)
    assert list(fake.loaded[-1][1]) == list(client.fetch("demo", "d3", 0))


def test_unknown_rank_is_a_clear_error(demo, client, monkeypatch):
    fake = FakeMindSpore(rank=None).install(monkeypatch)
    monkeypatch.delenv("RANK_ID", raising=False)
    with pytest.raises(ckptd.InvalidArgument, match="RANK_ID is not set"):
        ckptd.mindspore.load_rank("net", client, "demo", "d3")
    monkeypatch.setenv("RANK_ID", "two")
    with pytest.raises(ckptd.InvalidArgument, match="RANK_ID='two'"):
        ckptd.mindspore.load_rank("net", client, "demo", "d3")
    assert fake.loaded == []


def test_fetch_errors_reach_the_caller_unchanged(demo, client, monkeypatch):
    fake = FakeMindSpore(rank=5).install(monkeypatch)
    with pytest.raises(ckptd.OutOfRange):
        ckptd.mindspore.load_rank("net", client, "demo", "d3")  # d3 has 3 ranks
    assert fake.loaded == []
