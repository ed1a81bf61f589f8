"""One component's PyTorch wrapper -> one ONNX file (TorchScript exporter), with metadata_props."""

from __future__ import annotations

import io
import warnings

import onnx
import torch

from chattts_forge.convert.components import ComponentSpec
from chattts_forge.errors import ForgeError

OPSET = 17
TORCHSCRIPT_CONVERTER = f"torch.onnx.export (TorchScript, dynamo=False), torch {torch.__version__}"
# protobuf's hard limit for one message; above it weights go to `<file>.data`.


def export_model(spec: ComponentSpec, opset: int = OPSET) -> onnx.ModelProto:
    """Trace `spec.wrapper` on its example inputs into an ONNX model with dynamic axes."""
    spec.wrapper.eval()
    buf = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        # Tracer warnings about python-level shape arithmetic are expected; parity checks the result.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            spec.wrapper,
            spec.example,
            buf,
            input_names=[i.name for i in spec.inputs],
            output_names=[o.name for o in spec.outputs],
            dynamic_axes=spec.dynamic_axes,
            opset_version=opset,
            do_constant_folding=True,
            dynamo=False,
        )
    model = onnx.load_from_string(buf.getvalue())
    check_io_names(model, spec)
    return model


def check_io_names(model: onnx.ModelProto, spec: ComponentSpec) -> None:
    got_in = [i.name for i in model.graph.input]
    got_out = [o.name for o in model.graph.output]
    want_in = [i.name for i in spec.inputs]
    want_out = [o.name for o in spec.outputs]
    if got_in != want_in or got_out != want_out:
        raise ForgeError(
            f"{spec.name}: exported graph I/O {got_in} -> {got_out} differs from the contract {want_in} -> {want_out}"
        )


def set_metadata(model: onnx.ModelProto, props: dict[str, str]) -> None:
    """Replace the model's metadata_props with `props` (keys sorted, values as strings)."""
    del model.metadata_props[:]
    for key in sorted(props):
        entry = model.metadata_props.add()
        entry.key = key
        entry.value = str(props[key])
