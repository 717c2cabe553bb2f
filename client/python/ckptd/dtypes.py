"""MindSpore tensor element types and the NumPy arrays the client returns for them.

Every MindSpore dtype maps to an array holding exactly the bytes the server sent (row-major,
little-endian, as in a .ckpt):

  =========  =================================================================================
  Bool       numpy.bool_
  Int8 ..    numpy.int8, uint8, int16, uint16, int32, uint32, int64, uint64 (little-endian)
  Float16    numpy.float16;  Float32 numpy.float32;  Float64 numpy.float64
  BFloat16   numpy.uint16 holding the bfloat16 bit patterns (NumPy has no bfloat16): the value
             of element x is the float32 whose upper 16 bits are x. `bfloat16_to_float32`
             widens it exactly; `fetch(..., upcast=True)` does so for every bf16 tensor.
  Int4       numpy.uint8 holding the packed bytes (qint4x2, two 4-bit values per byte), shape
             the tensor's with its last dim halved (MindSpore slices Int4 on whole bytes only).
  str        a 0-d numpy.str_ array ('<U<n>'): MindSpore stores strings as UTF-32LE, which is
             NumPy's own unicode layout, so its bytes are the stored ones. An empty string is
             returned as a '<U1' array holding "" (NumPy has no zero-width unicode dtype).
  =========  =================================================================================
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

# MindSpore spelling -> NumPy dtype of the returned array (None: computed per tensor).
_NUMPY = {
    "Bool": np.dtype(np.bool_),
    "Int8": np.dtype("<i1"),
    "UInt8": np.dtype("<u1"),
    "Int16": np.dtype("<i2"),
    "UInt16": np.dtype("<u2"),
    "Int32": np.dtype("<i4"),
    "UInt32": np.dtype("<u4"),
    "Int64": np.dtype("<i8"),
    "UInt64": np.dtype("<u8"),
    "Float16": np.dtype("<f2"),
    "Float32": np.dtype("<f4"),
    "Float64": np.dtype("<f8"),
    "BFloat16": np.dtype("<u2"),
    "Int4": np.dtype("<u1"),
    "str": None,
}

#: Every MindSpore dtype spelling, as it appears in a .ckpt and in the API.
MINDSPORE_DTYPES = tuple(_NUMPY)


def is_known(dtype: str) -> bool:
    """Whether `dtype` is one of MindSpore's spellings (case-sensitive)."""
    return dtype in _NUMPY


def element_bits(dtype: str) -> int:
    """Bits per element: 4 for Int4, 32 for str (one UTF-32 code unit), else 8 x byte size."""
    if dtype == "Int4":
        return 4
    if dtype == "str":
        return 32
    return _NUMPY[dtype].itemsize * 8


def logical_shape(dtype: str, dims: Sequence[int]) -> tuple:
    """The shape MindSpore's reader gives stored `dims`: () for any str and for dims [0]."""
    dims = tuple(int(d) for d in dims)
    if dtype == "str" or dims == (0,):
        return ()
    return dims


def byte_size(dtype: str, shape: Sequence[int]) -> int:
    """Bytes of a tensor of `dtype` and logical `shape` (str: not determined by the shape)."""
    elements = math.prod(shape)
    bits = element_bits(dtype) * elements
    if bits % 8:
        raise ValueError(f"an Int4 tensor needs an even number of elements, got {elements}")
    return bits // 8


def array_layout(dtype: str, shape: Sequence[int], nbytes: int) -> tuple[np.dtype, tuple]:
    """The NumPy dtype and shape of the array holding `nbytes` bytes of a tensor.

    Raises ValueError when `nbytes` does not fit the dtype and shape.
    """
    shape = tuple(int(d) for d in shape)
    if dtype == "str":
        if nbytes % 4:
            raise ValueError(f"a str value of {nbytes} bytes is not UTF-32 (a multiple of 4)")
        return np.dtype(f"<U{max(nbytes // 4, 1)}"), ()
    if dtype not in _NUMPY:
        raise ValueError(f"unknown MindSpore dtype {dtype!r}")
    np_dtype = _NUMPY[dtype]
    if dtype == "Int4":
        if not shape or shape[-1] % 2:
            raise ValueError(f"an Int4 slice needs an even last dim, got shape {list(shape)}")
        shape = shape[:-1] + (shape[-1] // 2,)
    expected = math.prod(shape) * np_dtype.itemsize
    if expected != nbytes and shape == (0,) and nbytes == np_dtype.itemsize:
        shape = ()  # MindSpore's scalar spelled dims [0]
        expected = nbytes
    if expected != nbytes:
        raise ValueError(f"{nbytes} bytes do not make a {dtype} tensor of shape {list(shape)}")
    return np_dtype, shape


def bfloat16_to_float32(bits: np.ndarray) -> np.ndarray:
    """Widens a uint16 array of bfloat16 bit patterns to float32, exactly (a new array)."""
    if bits.dtype != np.dtype("<u2"):
        raise TypeError(f"expected a uint16 array of bfloat16 bits, got {bits.dtype}")
    wide = bits.astype("<u4")
    wide <<= 16
    return wide.view("<f4")


def upcast(dtype: str, array: np.ndarray) -> np.ndarray:
    """float32 for BFloat16 and Float16 arrays (a widened copy); any other array unchanged."""
    if dtype == "BFloat16":
        return bfloat16_to_float32(array)
    if dtype == "Float16":
        return array.astype("<f4")
    return array
