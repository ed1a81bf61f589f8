"""The PyTorch reference: ChatTTS's own code, loaded from any checkpoint, and the parity oracle.

- `chat.load_chat(path, device="cpu") -> ChatTTS.Chat`: tiny or full, synthetic or released.
- `reference.reference_synthesize(chat, text, ReferenceParams(...))`: `Chat.infer` with its knobs (wav,
  codes, hiddens); the `chattts-forge reference` command (`cli.py`) maps its options onto a
  `ReferenceConfig` for `reference.reference_to_files`.
- `oracle.chattts_codes / chattts_teacher_forced_logits / chattts_decode_to_wavs`: ChatTTS's
  generation (knobs: `oracle.OracleParams`) and decoding, instrumented (processed/raw logits, top-2
  gaps) for parity tests.
- `compare.compare_codes`: the issue-4 rule (codes equal, divergence only at a near-tie, reported).
- `python -m chattts_forge.convert.parity_full --checkpoint C --artifact A`: that check on a
  full checkpoint, with figures.
- `engine.TorchEngine`: ChatTTS's pipeline timed like the runtime's `timed_engine.OnnxEngine` (bench,
  the evaluate stage's PyTorch baseline).

torch and the chattts package are imported here (and only lazily by the rest of the project). The
package is the `torch` layer (docs/architecture.md): it may import the core and the runtime.
"""
