"""The protobuf wire format of the messages the Tinker SDK exchanges in protobuf, by hand.

Field numbers are those of the SDK's `tinker/proto/tinker_public.proto` (tinker 0.38.0):
`ForwardBackwardRequest` is decoded, `ForwardBackwardOutput` and `SampleResponse` encoded.
A malformed message raises `ProtoError` naming the field it was reading.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

VARINT, I64, LEN, I32 = 0, 1, 2, 5
DTYPE_FLOAT32, DTYPE_INT64, DTYPE_INT32 = 1, 2, 3
STOP_REASON = {"stop": 0, "length": 1}
REQUEST_FIELDS = {
    1: "model_id",
    2: "seq_id",
    3: "data",
    4: "loss_fn",
    5: "loss_fn_config",
    6: "forward_only",
    7: "loss_fn_config_v2",
}
"""The fields of `ForwardBackwardRequest`, by number."""


class ProtoError(ValueError):
    """A message that is not the protobuf it claims to be; `field` names where."""

    def __init__(self, field_path: str, reason: str) -> None:
        super().__init__(f"{field_path}: {reason}")
        self.field = field_path


def _varint(buf: bytes, pos: int, where: str) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ProtoError(where, "truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift >= 64:
            raise ProtoError(where, "varint longer than 10 bytes")


def fields(
    buf: bytes, where: str, names: dict[int, str] | None = None
) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of each field of a message, in order; an error reading
    a field of `names` names that field."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos, where)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise ProtoError(where, "field number 0")
        at = (names or {}).get(number, where)
        if wire == VARINT:
            value, pos = _varint(buf, pos, at)
            yield number, wire, value
        elif wire == LEN:
            size, pos = _varint(buf, pos, at)
            if pos + size > len(buf):
                raise ProtoError(at, "length-delimited field runs past the message")
            yield number, wire, buf[pos : pos + size]
            pos += size
        elif wire in (I64, I32):
            width = 8 if wire == I64 else 4
            if pos + width > len(buf):
                raise ProtoError(at, "truncated fixed-width field")
            yield number, wire, buf[pos : pos + width]
            pos += width
        else:
            raise ProtoError(at, f"unsupported wire type {wire}")


def _bytes(value: int | bytes, where: str) -> bytes:
    if not isinstance(value, bytes):
        raise ProtoError(where, "expected a length-delimited field")
    return value


def _int(value: int | bytes, where: str) -> int:
    if not isinstance(value, int):
        raise ProtoError(where, "expected a varint field")
    return value


def _text(value: int | bytes, where: str) -> str:
    try:
        return _bytes(value, where).decode()
    except UnicodeDecodeError:
        raise ProtoError(where, "not UTF-8") from None


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


@dataclass
class TensorIn:
    """A `Tensor` as sent: dtype, shape and dense values (sparse CSR is refused by the caller)."""

    dtype: int = 0
    shape: list[int] = field(default_factory=list)
    dense: bytes | None = None
    sparse: bool = False

    def values(self, where: str) -> list[int] | list[float]:
        if self.sparse:
            raise ProtoError(where, "sparse CSR tensors are not served; send a dense tensor")
        if self.dense is None:
            raise ProtoError(where, "has no values")
        if self.dtype == DTYPE_FLOAT32:
            np_dtype: type = np.float32
        elif self.dtype == DTYPE_INT64:
            np_dtype = np.int64
        else:
            raise ProtoError(where, f"dtype {self.dtype} is not float32 or int64")
        if len(self.dense) % np.dtype(np_dtype).itemsize:
            raise ProtoError(where, "byte length is not a whole number of values")
        return np.frombuffer(self.dense, dtype=np_dtype).tolist()


@dataclass
class DatumIn:
    tokens: list[int] = field(default_factory=list)
    loss_fn_inputs: dict[str, TensorIn] = field(default_factory=dict)
    refused: str | None = None
    """What the datum holds that is not served (an image, audio). Provenance spans (fields 3
    and 4) are skipped: only `stable_reinforce`, which is not served, reads them."""


@dataclass
class ForwardBackwardIn:
    model_id: str = ""
    seq_id: int = 0
    loss_fn: str = ""
    loss_fn_config: dict[str, float | str] = field(default_factory=dict)
    forward_only: bool = False
    data: list[DatumIn] = field(default_factory=list)


def _tensor(buf: bytes, where: str) -> TensorIn:
    tensor = TensorIn()
    for number, wire, value in fields(buf, where):
        if number == 1:
            tensor.dense = _bytes(value, f"{where}.dense")
        elif number == 2:
            tensor.sparse = True
        elif number == 3:
            tensor.dtype = _int(value, f"{where}.dtype")
        elif number == 4:
            if wire == LEN:  # packed
                packed = _bytes(value, f"{where}.shape")
                pos = 0
                while pos < len(packed):
                    dim, pos = _varint(packed, pos, f"{where}.shape")
                    tensor.shape.append(_signed(dim))
            else:
                tensor.shape.append(_signed(_int(value, f"{where}.shape")))
    return tensor


def _entry(buf: bytes, where: str) -> tuple[str, bytes]:
    key, body = "", b""
    for number, _, value in fields(buf, where):
        if number == 1:
            key = _text(value, f"{where}.key")
        elif number == 2:
            body = _bytes(value, f"{where}.value")
    return key, body


def _chunk_tokens(buf: bytes, where: str, datum: DatumIn) -> None:
    for number, _, value in fields(buf, where):
        if number == 1:
            for inner, _, tokens in fields(_bytes(value, where), f"{where}.encoded_text"):
                if inner == 1:
                    raw = _bytes(tokens, f"{where}.encoded_text.tokens")
                    if len(raw) % 4:
                        raise ProtoError(f"{where}.encoded_text.tokens", "not int32 values")
                    datum.tokens.extend(np.frombuffer(raw, dtype="<i4").tolist())
        elif number == 2:
            datum.refused = datum.refused or "image chunks"
        elif number == 3:
            datum.refused = datum.refused or "audio (dmel) chunks"


def _datum(buf: bytes, where: str) -> DatumIn:
    datum = DatumIn()
    for number, _, value in fields(buf, where):
        if number == 1:
            _chunk_tokens(_bytes(value, f"{where}.model_input"), f"{where}.model_input", datum)
        elif number == 2:
            key, body = _entry(_bytes(value, f"{where}.loss_fn_inputs"), f"{where}.loss_fn_inputs")
            datum.loss_fn_inputs[key] = _tensor(body, f"{where}.loss_fn_inputs.{key}")
    return datum


def _config_value(buf: bytes, where: str) -> float | str:
    for number, wire, value in fields(buf, where):
        if number == 1 and wire == I64:
            return struct.unpack("<d", _bytes(value, where))[0]
        if number == 2:
            return _text(value, where)
    raise ProtoError(where, "has no value")


def decode_forward_backward(buf: bytes) -> ForwardBackwardIn:
    """A `ForwardBackwardRequest`; `ProtoError` naming the field if it is not one."""
    request = ForwardBackwardIn()
    legacy: dict[str, float | str] = {}
    for number, _, value in fields(buf, "body", REQUEST_FIELDS):
        if number == 1:
            request.model_id = _text(value, "model_id")
        elif number == 2:
            request.seq_id = _signed(_int(value, "seq_id"))
        elif number == 3:
            index = len(request.data)
            request.data.append(_datum(_bytes(value, f"data[{index}]"), f"data[{index}]"))
        elif number == 4:
            request.loss_fn = _text(value, "loss_fn")
        elif number == 5:
            key, body = _entry(_bytes(value, "loss_fn_config"), "loss_fn_config")
            if len(body) not in (0, 8):  # a double (absent: 0.0)
                raise ProtoError(f"loss_fn_config.{key}", "expected a double")
            legacy[key] = struct.unpack("<d", body)[0] if body else 0.0
        elif number == 6:
            request.forward_only = bool(_int(value, "forward_only"))
        elif number == 7:
            key, body = _entry(_bytes(value, "loss_fn_config_v2"), "loss_fn_config_v2")
            request.loss_fn_config[key] = _config_value(body, f"loss_fn_config_v2.{key}")
    for key, number_value in legacy.items():
        request.loss_fn_config.setdefault(key, number_value)
    return request


def _key(number: int, wire: int) -> bytes:
    return _varint_bytes(number << 3 | wire)


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _key(number, LEN) + _varint_bytes(len(payload)) + payload


def _varint_field(number: int, value: int) -> bytes:
    return _key(number, VARINT) + _varint_bytes(value)


def _batched(arrays: list[np.ndarray], dtype: int) -> bytes:
    """A `BatchedTensor`: the arrays' bytes back to back, with byte offsets."""
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    for index, array in enumerate(arrays):
        offsets[index + 1] = offsets[index] + array.nbytes
    data = b"".join(array.tobytes() for array in arrays)
    return _len_field(1, data) + _len_field(2, offsets.tobytes()) + _varint_field(3, dtype)


def encode_forward_backward_output(
    outputs: list[dict[str, list[float]]], metrics: dict[str, float]
) -> bytes:
    """A `ForwardBackwardOutput` of one `ArrayRecord`: each output field as float32 per datum."""
    record = _len_field(1, b"ArrayRecord") + _varint_field(3, len(outputs))
    names = sorted({name for output in outputs for name in output})
    for name in names:
        arrays = [np.asarray(output.get(name, []), dtype="<f4") for output in outputs]
        entry = _len_field(1, name.encode()) + _len_field(2, _batched(arrays, DTYPE_FLOAT32))
        record += _len_field(2, entry)
    body = _len_field(1, b"ArrayRecord") + _len_field(2, record)
    for key, value in metrics.items():
        entry = _len_field(1, key.encode()) + _key(2, I64) + struct.pack("<d", value)
        body += _len_field(3, entry)
    return body


def encode_sample_response(
    sequences: list[dict[str, object]], prompt_logprobs: list[float | None] | None
) -> bytes:
    """A `SampleResponse`: tokens as int32, logprobs as float32, NaN for a missing prompt one."""
    body = b""
    for sequence in sequences:
        tokens = np.asarray(sequence["tokens"], dtype="<i4").tobytes()
        logprobs = np.asarray(sequence["logprobs"], dtype="<f4").tobytes()
        message = (
            _varint_field(1, STOP_REASON[str(sequence["stop_reason"])])
            + _len_field(2, tokens)
            + _len_field(3, logprobs)
        )
        body += _len_field(1, message)
    if prompt_logprobs is not None:
        values = [float("nan") if lp is None else lp for lp in prompt_logprobs]
        body += _len_field(2, np.asarray(values, dtype="<f4").tobytes())
    return body
