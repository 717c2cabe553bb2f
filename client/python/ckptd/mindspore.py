"""MindSpore adapter: load this process's rank of a stored checkpoint straight into a network.

    import ckptd, ckptd.mindspore
    client = ckptd.Client()
    not_loaded = ckptd.mindspore.load_rank(net, client, "run-42", "infer-3dev")

replaces MindSpore's `load_distributed_checkpoint(net, files, predict_strategy)`, or
`transform_checkpoint_by_rank(...)` followed by `load_checkpoint` + `load_param_into_net`: the
server computes the rank's slices, which arrive as NumPy arrays (Client.fetch) and are wrapped as
`mindspore.Parameter`s. MindSpore is imported only when `load_rank` runs.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

from ckptd.dtypes import bfloat16_to_float32
from ckptd.errors import InvalidArgument


def current_rank() -> int:
    """This process's global rank: MindSpore's `communication.get_rank()` when its
    communication is initialised, else the RANK_ID environment variable."""
    try:
        from mindspore.communication import get_rank
        return int(get_rank())
    except Exception:  # not installed, or init() not called: get_rank raises RuntimeError
        pass
    value = os.environ.get("RANK_ID")
    if value is not None:
        try:
            return int(value)
        except ValueError:
            raise InvalidArgument(f"RANK_ID={value!r} is not a rank number") from None
    raise InvalidArgument("cannot tell this process's rank: MindSpore's communication is not "
                          "initialised and RANK_ID is not set; pass rank=")


def load_rank(net, client, ckpt: str, dst_strategy: str, rank: Optional[int] = None, *,
              include: Optional[Sequence[str]] = None, exclude: Optional[Sequence[str]] = None,
              strict_load: bool = False):
    """Fetches destination rank `rank` (default: current_rank()) of checkpoint `ckpt` laid out
    by the registered `dst_strategy`, wraps every tensor as `mindspore.Parameter(Tensor)` and
    calls `mindspore.load_param_into_net(net, params, strict_load=strict_load)`, returning what
    it returns: the network's parameters that were not loaded.

    BFloat16 tensors become bfloat16 MindSpore tensors (built from their exact float32 values);
    str values (MindSpore's append_dict strings) are not parameters and are left out. Int4
    tensors are refused (InvalidArgument): fetch them with Client.fetch, which returns their
    packed bytes. Errors of the fetch are ckptd.Error subclasses.
    """
    import mindspore

    if rank is None:
        rank = current_rank()
    tensors = client.fetch(ckpt, dst_strategy, rank, include=include, exclude=exclude)
    params = {}
    for name in list(tensors):
        array = tensors.pop(name)  # the arrays go to MindSpore one at a time
        dtype = tensors.info[name].dtype
        if dtype == "str":
            continue
        if dtype == "Int4":
            raise InvalidArgument(f"tensor {name} is Int4, which load_rank does not convert; "
                                  f"use Client.fetch for its packed bytes")
        if dtype == "BFloat16":
            tensor = mindspore.Tensor(bfloat16_to_float32(array), dtype=mindspore.bfloat16)
        else:
            tensor = mindspore.Tensor(array)
        params[name] = mindspore.Parameter(tensor, name=name)
    return mindspore.load_param_into_net(net, params, strict_load=strict_load)
