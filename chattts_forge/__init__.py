"""chattts-forge: turn a ChatTTS checkpoint into fast, verified ONNX artifacts."""

__version__ = "0.1.0"
