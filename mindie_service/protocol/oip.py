"""The Open Inference Protocol v2 (KServe v2, Triton's HTTP/REST protocol: kserve's
docs/predict-api/v2/required_api.md): server and model metadata, and ``POST /v2/models/{name}/infer``.

A model takes one input: ``text_input`` (BYTES, shape [B] or [B, 1]: B prompts) or ``input_ids`` (INT32 or
INT64, shape [L] or [B, L]: token ids); ``parameters`` are MindIE's sampling fields (protocol.mindie's table).
It answers ``text_output`` (BYTES, [B]) and, when asked for in ``outputs``, ``output_ids`` (INT64, [B, N],
rows padded with -1). Binary tensors (Triton's extension) are decoded by protocol.oip_binary; an output is sent
binary when its ``parameters.binary_data`` asks, else when the request's ``parameters.binary_data_output`` does
(tritonclient's defaults), and JSON otherwise. Every other key, at any level, is refused by name (Triton's
``classification`` and sequence parameters included: nothing here serves them). Errors: ``{"error"}``."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from mindie_service.errors import check
from mindie_service.inputs.types import TextPrompt, TokensPrompt
from mindie_service.params.ranges import INT32_MAX
from mindie_service.protocol.mindie import parse_generation
from mindie_service.protocol.request import GenerationRequest, GenerationResult, ProtocolLimits
from mindie_service.protocol.triton_generate import ModelRef, request_id
from mindie_service.params.rule import Field, FieldTable, Rule, read_fields
from mindie_service.protocol.validation import refuse_unknown, require_object

MAX_BATCH = 16  # prompts in one infer call (each takes an engine request)
INPUTS = [{"name": "text_input", "datatype": "BYTES", "shape": [-1]},
          {"name": "input_ids", "datatype": "INT64", "shape": [-1, -1]}]
OUTPUTS = [{"name": "text_output", "datatype": "BYTES", "shape": [-1]},
           {"name": "output_ids", "datatype": "INT64", "shape": [-1, -1]}]
_OUT_NAMES = {o["name"] for o in OUTPUTS}
_BODY_KEYS = frozenset({"id", "inputs", "outputs", "parameters"})
_TENSOR_KEYS = frozenset({"name", "shape", "datatype", "parameters", "data"})
_BINARY_OUTPUT: FieldTable = {"binary_data_output": Field("binary_data_output", Rule("bool"))}
_BINARY_DATA: FieldTable = {"binary_data": Field("binary_data", Rule("bool"))}


def server_metadata(version: str) -> dict[str, Any]:
    return {"name": "mindie-service", "version": version, "extensions": ["generate"]}


def model_metadata(model: ModelRef) -> dict[str, Any]:
    return {"name": model.name, "versions": [model.version], "platform": "mindie-service",
            "inputs": INPUTS, "outputs": OUTPUTS}


@dataclass(frozen=True)
class OipRequest:
    """A validated infer call: one GenerationRequest per prompt, the outputs asked for, the client's id."""

    gens: list[GenerationRequest]
    outputs: tuple[str, ...]
    rid: str | None
    binary: frozenset[str] = frozenset()  # the outputs sent as binary data


def _shape(t: dict[str, Any], name: str) -> list[int]:
    shape = t.get("shape")
    check(isinstance(shape, list) and 1 <= len(shape) <= 2 and all(type(d) is int and d >= 0 for d in shape),
          f"{name}.shape", "a list of 1 or 2 non-negative integers", shape)
    return shape


def _flat(data: Any, name: str) -> list[Any]:
    """A tensor's ``data``, flattened (OIP allows nested lists in row-major order)."""
    check(isinstance(data, list), f"{name}.data", "a list", type(data).__name__)
    out: list[Any] = []
    for v in data:
        out.extend(_flat(v, name) if isinstance(v, list) else [v])
    return out


def _prompts(t: dict[str, Any]) -> list[TextPrompt | TokensPrompt]:
    name, dtype = t.get("name"), t.get("datatype")
    refuse_unknown(t, _TENSOR_KEYS, "inputs[0].")
    params = t.get("parameters")
    check(params is None or isinstance(params, dict), f"{name}.parameters", "an object", params)
    check(not params or "binary_data_size" not in params, f"{name}.parameters.binary_data_size",
          "absent from a JSON body (binary data needs the Inference-Header-Content-Length header)",
          (params or {}).get("binary_data_size"))
    refuse_unknown(params or {}, set(), "inputs[0].parameters.")
    shape, data = _shape(t, str(name)), _flat(t.get("data"), str(name))
    size = shape[0] * (shape[1] if len(shape) == 2 else 1)
    check(len(data) == size, f"{name}.data", f"{size} elements (shape {shape})", len(data))
    if name == "text_input":
        check(dtype == "BYTES", "text_input.datatype", "BYTES", dtype)
        check(len(shape) == 1 or shape[1] == 1, "text_input.shape", "[B] or [B, 1]", shape)
        check(all(isinstance(s, str) and s for s in data), "text_input.data", "non-empty strings", data)
        return [TextPrompt(s) for s in data]
    check(name == "input_ids", "inputs[0].name", "text_input or input_ids", name)
    check(dtype in ("INT32", "INT64"), "input_ids.datatype", "INT32 or INT64", dtype)
    check(all(type(v) is int and 0 <= v <= INT32_MAX for v in data), "input_ids.data", "token ids", data[:8])
    rows = [data] if len(shape) == 1 else [data[k * shape[1]:(k + 1) * shape[1]] for k in range(shape[0])]
    check(all(rows), "input_ids.shape", "a non-empty row of ids per prompt", shape)
    return [TokensPrompt(tuple(r)) for r in rows]


def _outputs(body: dict[str, Any], binary_default: bool) -> tuple[tuple[str, ...], frozenset[str]]:
    """The outputs asked for (default: text_output) and those of them to send as binary data."""
    outs = body.get("outputs")
    if outs is None:
        return ("text_output",), frozenset({"text_output"} if binary_default else ())
    check(isinstance(outs, list) and outs and all(isinstance(o, dict) for o in outs), "outputs",
          "a non-empty list of objects", outs)
    names, binary = [], set()
    for i, o in enumerate(outs):
        refuse_unknown(o, {"name", "parameters"}, f"outputs[{i}].")
        params = require_object(o.get("parameters"), f"outputs[{i}].parameters")
        refuse_unknown(params, {"binary_data"}, f"outputs[{i}].parameters.")
        flag = read_fields(params, _BINARY_DATA, f"outputs[{i}].parameters.").get("binary_data", binary_default)
        names.append(o.get("name"))
        if flag:
            binary.add(o.get("name"))
    check(all(isinstance(n, str) and n in _OUT_NAMES for n in names), "outputs[].name",
          f"one of {sorted(_OUT_NAMES)}", names)
    return tuple(names), frozenset(binary)


def parse_infer(body: dict[str, Any], limits: ProtocolLimits) -> OipRequest:
    """``{"id"?, "inputs": [one tensor], "outputs"?, "parameters"?}`` -> OipRequest."""
    refuse_unknown(body, _BODY_KEYS)
    rid = request_id(body)
    inputs = body.get("inputs")
    check(isinstance(inputs, list) and len(inputs) == 1 and isinstance(inputs[0], dict), "inputs",
          "a list of one tensor (text_input or input_ids)", inputs)
    prompts = _prompts(inputs[0])
    check(1 <= len(prompts) <= MAX_BATCH, "inputs[0].shape[0]", f"a batch of 1 to {MAX_BATCH} prompts", len(prompts))
    params = dict(require_object(body.get("parameters"), "parameters"))
    check("stream" not in params, "parameters.stream", "absent (use /generate_stream)", params.get("stream"))
    binary_default = read_fields(params, _BINARY_OUTPUT, "parameters.").get("binary_data_output", False)
    params.pop("binary_data_output", None)
    base = parse_generation({"inputs": "-", "parameters": params}, dialect="mindie", stream=False, limits=limits,
                            priority="triton", extra_keys=frozenset())
    # the answer is tensors: nothing to carry details, token logprobs or the other best_of samples in
    check(not base.details, "parameters.details", "false (an infer answer has no details; use /generate)", True)
    check(base.top_n_tokens == 0, "parameters.top_n_tokens", "0 on /infer", base.top_n_tokens)
    check(base.best_of == 1, "parameters.best_of", "1 on /infer", base.best_of)
    gens = [dataclasses.replace(base, prompt=p) for p in prompts]
    outputs, binary = _outputs(body, binary_default)
    return OipRequest(gens, outputs, rid, binary)


def infer_response(model: ModelRef, req: OipRequest, results: list[GenerationResult]) -> dict[str, Any]:
    out: list[dict[str, Any]] = []
    texts = [g.prefix + r.text for g, r in zip(req.gens, results)]
    if "text_output" in req.outputs:
        out.append({"name": "text_output", "datatype": "BYTES", "shape": [len(texts)], "data": texts})
    if "output_ids" in req.outputs:
        ids = [[t.id for t in r.tokens] for r in results]
        width = max(len(r) for r in ids)
        flat = [v for r in ids for v in r + [-1] * (width - len(r))]
        out.append({"name": "output_ids", "datatype": "INT64", "shape": [len(ids), width], "data": flat})
    head: dict[str, Any] = {"id": req.rid} if req.rid is not None else {}
    return {**head, "model_name": model.name, "model_version": model.version, "outputs": out}
