"""The quality gate, as the evaluate stage has always named it: the one judge lives in
`chattts_forge.gate` (importable by quantize, evaluate and buckets alike); this module re-exports it."""

from chattts_forge.gate import DEFAULT_GATE, GATE_SCHEMA, METRICS, judge, load_gate

__all__ = ["DEFAULT_GATE", "GATE_SCHEMA", "METRICS", "judge", "load_gate"]
