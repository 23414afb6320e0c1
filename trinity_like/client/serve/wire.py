"""The SDK's protobuf wire format, server side: what ``tinker`` 0.38 sends and expects.

The SDK posts ``forward_backward`` as a protobuf ``ForwardBackwardRequest`` and asks for
``ForwardBackwardOutput`` and ``SampleResponse`` results as protobuf (``Accept:
application/x-protobuf``); everything else travels as JSON of the ``tinker.types`` models.
The message classes are the SDK's own (``tinker.proto.tinker_public_pb2``); these functions
are the inverse of its ``request_conv`` / ``response_conv``::

    request = decode_forward_backward(body)           # -> (types.ForwardBackwardRequest, forward_only)
    body = encode_result(types.ForwardBackwardOutput(...))   # bytes the SDK's deserializer reads
    json_result(types.SampleResponse(...))            # the same result as JSON, for other callers
"""

from __future__ import annotations

import numpy as np
from google.protobuf.message import DecodeError
from tinker import types
from tinker.proto import tinker_public_pb2 as pb

from trinity_like.errors import TrinityError

PROTO_CONTENT_TYPE = "application/x-protobuf"
_DTYPES = {
    pb.DTYPE_FLOAT32: ("float32", np.float32),
    pb.DTYPE_INT64: ("int64", np.int64),
    pb.DTYPE_INT32: ("int64", np.int32),
}  # the public wire widens int32 to int64
_PROTO_DTYPE = {np.dtype(np.float32): pb.DTYPE_FLOAT32, np.dtype(np.int64): pb.DTYPE_INT64}
_STOP = {"stop": pb.STOP_REASON_STOP, "length": pb.STOP_REASON_LENGTH}


class WireError(TrinityError, ValueError):
    """A request body the server cannot read (the message says which part)."""


def _tensor(msg: pb.Tensor, where: str) -> types.TensorData:
    if msg.dtype not in _DTYPES:
        raise WireError(f"{where}: tensor dtype {msg.dtype} is not float32 or int64")
    if msg.HasField("sparse_csr"):
        raise WireError(f"{where}: sparse tensors are not supported here (send dense arrays)")
    name, np_dtype = _DTYPES[msg.dtype]
    data = np.frombuffer(msg.dense, dtype=np_dtype).astype(np.int64 if name == "int64" else np.float32)
    shape = list(msg.shape) or [data.size]
    if int(np.prod(shape)) != data.size:
        raise WireError(f"{where}: shape {shape} does not match its {data.size} values")
    return types.TensorData(data=data.reshape(shape), dtype=name, shape=shape)


def _chunk(msg: pb.Chunk, where: str) -> types.EncodedTextChunk:
    kind = msg.WhichOneof("chunk")
    if kind != "encoded_text":
        raise WireError(f"{where}: model_input chunk of type {kind!r} is not supported (token chunks only)")
    return types.EncodedTextChunk(tokens=np.frombuffer(msg.encoded_text.tokens, dtype=np.int32).tolist())


def decode_forward_backward(body: bytes) -> tuple[types.ForwardBackwardRequest, bool]:
    """The SDK's protobuf ``forward_backward`` body as ``(request, forward_only)``."""
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except DecodeError as exc:
        raise WireError(f"forward_backward body is not a ForwardBackwardRequest protobuf: {exc}") from None
    data = []
    for i, d in enumerate(msg.data):
        chunks = [_chunk(c, f"datum {i}") for c in d.model_input]
        inputs = {k: _tensor(t, f"datum {i}: loss_fn_inputs[{k!r}]") for k, t in d.loss_fn_inputs.items()}
        data.append(types.Datum(model_input=types.ModelInput(chunks=chunks), loss_fn_inputs=inputs))
    config: dict[str, float | str] = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for k, v in msg.loss_fn_config_v2.items():  # the SDK writes both; v2 carries strings too
        config[k] = v.text if v.WhichOneof("value") == "text" else float(v.number)
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(
            data=data, loss_fn=msg.loss_fn, loss_fn_config=config or None
        ),
        model_id=msg.model_id,
        seq_id=msg.seq_id,
    )
    return request, msg.forward_only


def _batched(arrays: list[np.ndarray]) -> pb.BatchedTensor:
    """Per-datum 1-D arrays of one dtype as one BatchedTensor (byte offsets, n + 1 of them)."""
    dtype = arrays[0].dtype if arrays else np.dtype(np.float32)
    out = pb.BatchedTensor(dtype=_PROTO_DTYPE[dtype])
    sizes = np.array([0] + [a.nbytes for a in arrays], dtype=np.int64)
    out.offsets = np.cumsum(sizes).astype(np.int64).tobytes()
    out.data = b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)
    return out


def encode_forward_backward_output(result: types.ForwardBackwardOutput) -> bytes:
    msg = pb.ForwardBackwardOutput(loss_fn_output_type=result.loss_fn_output_type)
    for k, v in result.metrics.items():
        msg.metrics[k] = float(v)
    if result.loss_fn_outputs:
        record = msg.loss_fn_outputs.add(num_datums=len(result.loss_fn_outputs))
        for name in result.loss_fn_outputs[0]:
            arrays = []
            for out in result.loss_fn_outputs:
                array = out[name].to_numpy()
                arrays.append(array.astype(np.int64 if np.issubdtype(array.dtype, np.integer) else np.float32).ravel())
            record.fields[name].CopyFrom(_batched(arrays))
    return msg.SerializeToString()


def encode_sample_response(result: types.SampleResponse) -> bytes:
    msg = pb.SampleResponse()
    for seq in result.sequences:
        out = msg.sequences.add(
            stop_reason=_STOP[seq.stop_reason], tokens=np.asarray(seq.tokens, dtype=np.int32).tobytes()
        )
        if seq.logprobs is not None:
            out.logprobs = np.asarray(seq.logprobs, dtype=np.float32).tobytes()
    if result.prompt_logprobs is not None:
        values = [np.nan if x is None else x for x in result.prompt_logprobs]
        msg.prompt_logprobs = np.asarray(values, dtype=np.float32).tobytes()
    return msg.SerializeToString()


ENCODERS = {types.ForwardBackwardOutput: encode_forward_backward_output, types.SampleResponse: encode_sample_response}


def encode_result(result: object) -> bytes:
    """A result the SDK reads as protobuf (the types in ``ENCODERS``)."""
    return ENCODERS[type(result)](result)


def json_result(result: types.ForwardBackwardOutput | types.SampleResponse) -> dict:
    """A result of ``ENCODERS``' types as JSON, for a caller that did not ask for protobuf (curl,
    a script of its own): the fields of the protobuf message, arrays as lists, a prompt
    position without a logprob as null. (The SDK always asks for protobuf.)"""
    if isinstance(result, types.SampleResponse):
        return {
            "type": "sample",
            "sequences": [
                {
                    "sequence_id": seq.sequence_id,
                    "tokens": seq.tokens,
                    "logprobs": seq.logprobs,
                    "stop_reason": seq.stop_reason,
                }
                for seq in result.sequences
            ],
            "prompt_logprobs": result.prompt_logprobs,
        }
    return {
        "loss_fn_output_type": result.loss_fn_output_type,
        "loss_fn_outputs": [
            {name: {"data": t.tolist(), "dtype": t.dtype, "shape": t.shape} for name, t in out.items()}
            for out in result.loss_fn_outputs
        ],
        "metrics": dict(result.metrics),
    }
