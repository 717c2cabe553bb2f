#!/usr/bin/python3
"""Decodes a MindSpore .ckpt independently of ckptd's C++ codec, as MindSpore's reader does.

A .ckpt is a concatenation of serialized Checkpoint messages holding one Value each (spec §1.2);
by protobuf merge semantics the whole file parses as one Checkpoint. Consecutive Values with the
same tag are chunks of one tensor and are joined; the joined bytes are interpreted with numpy
according to tensor_type and dims (§1.3, §1.4). An optional crc_num trailer (§1.5) is verified
and stripped.

Prints one JSON object on stdout:
  {"tensors": [{"name", "dtype", "shape", "elements", "sha256", "sum"|"value"}...]}
where sha256 is over the tensor's joined raw bytes. Exit status 0 on success, 1 when the file
does not decode, 3 (with {"skip": reason}) when numpy or the generated protobuf module is
missing, so that the calling test can skip visibly.

Usage: check_ckpt.py --proto-dir DIR FILE   (DIR holds mindspore_checkpoint_pb2.py)
"""

import argparse
import hashlib
import json
import math
import sys
import zlib


def numpy_dtype(np, tensor_type):
    """numpy dtype of MindSpore's tensor_type spelling; BFloat16 is read as raw uint16."""
    table = {
        "Bool": np.bool_,
        "Int8": np.int8,
        "UInt8": np.uint8,
        "Int16": np.int16,
        "UInt16": np.uint16,
        "Int32": np.int32,
        "UInt32": np.uint32,
        "Int64": np.int64,
        "UInt64": np.uint64,
        "Float16": np.float16,
        "Float32": np.float32,
        "Float64": np.float64,
        "BFloat16": np.uint16,
    }
    if tensor_type not in table:
        raise ValueError("unsupported tensor_type %r" % tensor_type)
    return np.dtype(table[tensor_type]).newbyteorder("<")


def strip_crc(data):
    if len(data) >= 17 and data[-17:-10] == b"crc_num":
        expected = int.from_bytes(data[-10:], "big")
        if zlib.crc32(data[:-17]) & 0xFFFFFFFF != expected:
            raise ValueError("crc_num trailer does not match")
        return data[:-17]
    return data


def decode(np, pb, data):
    ckpt = pb.Checkpoint()
    ckpt.ParseFromString(strip_crc(data))
    # Join consecutive same-tag values (MindSpore's _load_into_param_dict).
    joined = []
    for value in ckpt.value:
        if value.WhichOneof("value") != "tensor":
            raise ValueError("value %r is not a dense tensor" % value.tag)
        t = value.tensor
        if joined and joined[-1]["name"] == value.tag:
            last = joined[-1]
            if list(t.dims) != last["dims"] or t.tensor_type != last["dtype"]:
                raise ValueError("chunks of %r disagree on dims or dtype" % value.tag)
            last["chunks"].append(t.tensor_content)
        else:
            joined.append({"name": value.tag, "dtype": t.tensor_type, "dims": list(t.dims),
                           "chunks": [t.tensor_content]})
    out = []
    for t in joined:
        content = b"".join(t["chunks"])
        entry = {"name": t["name"], "dtype": t["dtype"],
                 "sha256": hashlib.sha256(content).hexdigest()}
        if t["dtype"] == "str":
            if len(content) % 4:
                raise ValueError("str tensor %r is not UTF-32" % t["name"])
            entry.update(shape=[], elements=1, value=content.decode("utf-32-le"))
        else:
            # dims [0] of a non-str tensor is a scalar, as MindSpore's reader treats it.
            shape = () if t["dims"] == [0] else tuple(t["dims"])
            array = np.frombuffer(content, dtype=numpy_dtype(np, t["dtype"])).reshape(shape)
            if t["dtype"] == "BFloat16":
                array = (array.astype(np.uint32) << 16).view(np.float32)
            # Random test bytes reinterpreted as floats can be NaN or inf: report the sum only
            # when finite (JSON has no NaN).
            with np.errstate(all="ignore"):
                total = float(np.sum(array.astype(np.float64)))
            entry.update(shape=list(array.shape), elements=int(array.size),
                         sum=total if math.isfinite(total) else None)
        out.append(entry)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proto-dir", required=True,
                        help="directory holding the generated mindspore_checkpoint_pb2.py")
    parser.add_argument("file")
    args = parser.parse_args()
    sys.path.insert(0, args.proto_dir)
    try:
        import numpy as np
        import mindspore_checkpoint_pb2 as pb
    except ImportError as e:
        print(json.dumps({"skip": "python module missing: %s" % e}))
        return 3
    with open(args.file, "rb") as f:
        data = f.read()
    try:
        tensors = decode(np, pb, data)
    except Exception as e:  # any decoding problem is a failed check, reported as such
        print(json.dumps({"error": "%s: %s" % (type(e).__name__, e)}))
        return 1
    print(json.dumps({"tensors": tensors}, allow_nan=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
