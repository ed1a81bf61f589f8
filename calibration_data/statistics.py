"""Streaming calibration statistics: what each quantizer needs, reduced as every graph input is produced.

`calibrate` runs every recorded feed once more through an *observer* session of the graph quantize
will read (gpt.onnx, the fused gpt_fast.onnx, head_code.onnx of the FP32 artifact) whose outputs
are the activation inputs of its constant-weight MatMuls, and folds each output into a fixed-size
`TensorStats` at once; nothing of the activation itself is kept. Per tensor:

- `min`, `max`: static INT8's minmax ranges (`quantize.static_fused`);
- `hist`: counts of |x| in `HIST_BINS` log2-spaced bins (fixed edges, so two histograms add exactly;
  a percentile read from it is within one bin, 2**(1/HIST_BINS_PER_OCTAVE), of the exact one);
- `absmax`, `sum_sq` / `rows` per channel (last axis): AWQ/imatrix-style importance of each input
  channel of the MatMuls that read the tensor.

And per layer and key/value, the per-(kv head, channel) max |x| over the valid past positions of every
GPT step (`KVStats`): the INT8 KV cache's scales (`quantize.kv_cache`).

Every field is a sum, a min or a max over samples, so `merge` of the statistics of two disjoint runs
equals the statistics of one run over both (up to float64 summation order), like `llama-imatrix
--in-file`. The size depends on the graphs only, never on the corpus.

And, for the graphs named in `Statistics.hessian_graphs` (calibrate: gpt and head_code), X^T X of
every MatMul input (`TensorStats.xtx`: GPTQ's Hessian, `quantize.gptq`), block-diagonal in blocks of
`HESSIAN_BLOCK` input channels when the width is a multiple of it: the full 3072^2 Hessians of the
20 down_proj inputs would take 755 MB, the 768-channel blocks 189 MB (float32; upper triangles on
disk: half that). The fused graph's MatMul inputs are the same activations as gpt.onnx's, so its
GPTQ reads gpt's Hessians (`match_tensors`) instead of a second copy.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from chattts_forge.errors import BadInput, ForgeError, IntegrityError

STATS_FILE = "statistics.npz"
STATS_SCHEMA = "chattts-forge/calibration-statistics/1"
# |x| histogram: bin 0 holds |x| < 2**HIST_LOW_EXP (zeros included); then HIST_BINS_PER_OCTAVE bins per
# power of two up to 2**HIST_HIGH_EXP; the last bin also holds anything larger.
HIST_LOW_EXP, HIST_HIGH_EXP, HIST_BINS_PER_OCTAVE = -20, 20, 32
HIST_BINS = 1 + (HIST_HIGH_EXP - HIST_LOW_EXP) * HIST_BINS_PER_OCTAVE
# X^T X is kept in diagonal blocks of this many input channels (whole when the width is no multiple).
HESSIAN_BLOCK = 768
# Rows X^T X gathers before one product: a prefill's 32 rows or a decode step's 8 make a thin product
# that writes the whole 768^2 block for little arithmetic; 256 rows per product cost a third per row,
# for ~110 MB of pending rows over a full-size GPT's 80 MatMul inputs.
HESSIAN_FLUSH_ROWS = 256


def hessian_block(channels: int) -> int:
    return HESSIAN_BLOCK if channels % HESSIAN_BLOCK == 0 else channels


def hist_edges() -> np.ndarray:
    """Upper edges of the |x| histogram's bins (the last one is +inf)."""
    exps = HIST_LOW_EXP + np.arange(1, HIST_BINS) / HIST_BINS_PER_OCTAVE
    return np.concatenate([[2.0**HIST_LOW_EXP], 2.0**exps[:-1], [np.inf]])


def _hist_of(absx: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        log2 = np.log2(absx, dtype=np.float64)
    # Clipped before the cast: exact zeros give log2 = -inf, which no integer holds (bin 0 takes them).
    idx = np.clip(np.floor((log2 - HIST_LOW_EXP) * HIST_BINS_PER_OCTAVE) + 1, 0, HIST_BINS - 1).astype(np.int64)
    return np.bincount(idx.ravel(), minlength=HIST_BINS).astype(np.int64)


@dataclass
class TensorStats:
    """Running statistics of one activation tensor (channels = its last axis)."""

    channels: int
    min: float = np.inf
    max: float = -np.inf
    hist: np.ndarray = field(default_factory=lambda: np.zeros(HIST_BINS, np.int64))
    absmax: np.ndarray = field(default_factory=lambda: np.zeros(0))
    sum_sq: np.ndarray = field(default_factory=lambda: np.zeros(0))
    rows: int = 0
    samples: int = 0
    xtx: np.ndarray | None = None  # [blocks, block, block] float32 X^T X (GPTQ's Hessian), or None
    xtx_rows: int = 0  # rows X^T X summed (a prefill may give it a subsample of its tokens)
    nonfinite_rows: int = 0  # rows holding inf/NaN, left out of every statistic (and counted)
    # rows counted in xtx_rows whose product is not yet in xtx (`flush_hessian` adds them)
    pending: list[np.ndarray] = field(default_factory=list, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.absmax.size == 0:
            self.absmax = np.zeros(self.channels, np.float32)
        if self.sum_sq.size == 0:
            self.sum_sq = np.zeros(self.channels, np.float64)

    def with_hessian(self) -> TensorStats:
        """Start accumulating X^T X (block-diagonal, `hessian_block`)."""
        if self.xtx is None:
            b = hessian_block(self.channels)
            self.xtx = np.zeros((self.channels // b, b, b), np.float32)
        return self

    def hessian(self) -> np.ndarray:
        """E[x x^T] [blocks, block, block] (float64), the mean over every row seen."""
        if self.xtx is None:
            raise ForgeError("these calibration statistics hold no X^T X (re-run `calibrate`)")
        self.flush_hessian()
        return self.xtx.astype(np.float64) / max(self.xtx_rows, 1)

    def flush_hessian(self) -> None:
        """Add the pending rows' X^T X (one BLAS product per diagonal block)."""
        if not self.pending or self.xtx is None:
            return
        rows = self.pending[0] if len(self.pending) == 1 else np.concatenate(self.pending)
        self.pending = []
        b = self.xtx.shape[1]
        for k in range(self.xtx.shape[0]):
            cols = np.ascontiguousarray(rows[:, k * b : (k + 1) * b])
            self.xtx[k] += cols.T @ cols

    def update(self, x: np.ndarray, hessian_rows: np.ndarray | None = None) -> None:
        """Fold `x` in; `hessian_rows`: the rows (of x flattened to [rows, channels]) X^T X sums, all when None."""
        x = np.asarray(x, dtype=np.float32)
        if x.shape[-1] != self.channels:
            raise ForgeError(f"activation has {x.shape[-1]} channels, its statistics {self.channels}")
        if x.size == 0:
            return
        flat = x.reshape(-1, self.channels)
        finite = np.isfinite(flat).all(axis=1)
        if not finite.all():  # an overflowing row would poison min/max and every sum: left out, counted
            self.nonfinite_rows += int((~finite).sum())
            if hessian_rows is not None:
                hessian_rows = hessian_rows[finite[hessian_rows]]
                hessian_rows = np.searchsorted(np.flatnonzero(finite), hessian_rows)
            flat = flat[finite]
            if flat.shape[0] == 0:
                return
        absx = np.abs(flat)
        self.min = min(self.min, float(flat.min()))
        self.max = max(self.max, float(flat.max()))
        self.hist += _hist_of(absx)
        np.maximum(self.absmax, absx.max(axis=0), out=self.absmax)
        self.sum_sq += np.einsum("ij,ij->j", flat, flat, dtype=np.float64)
        if self.xtx is not None:
            part = flat if hessian_rows is None else flat[hessian_rows]
            self.pending.append(part)
            self.xtx_rows += part.shape[0]
            if sum(len(p) for p in self.pending) >= HESSIAN_FLUSH_ROWS:
                self.flush_hessian()
        self.rows += flat.shape[0]
        self.samples += x.shape[0] if x.ndim >= 2 else 1  # a batch of rows: one sample each

    def merge(self, other: TensorStats) -> None:
        if other.channels != self.channels:
            raise ForgeError(f"cannot merge statistics of {other.channels} and {self.channels} channels")
        self.min, self.max = min(self.min, other.min), max(self.max, other.max)
        self.hist += other.hist
        np.maximum(self.absmax, other.absmax, out=self.absmax)
        self.sum_sq += other.sum_sq
        if self.xtx is not None and other.xtx is not None:
            self.flush_hessian()
            other.flush_hessian()
            self.xtx += other.xtx
            self.xtx_rows += other.xtx_rows
        elif self.xtx is not None or other.xtx is not None:
            raise ForgeError("cannot merge statistics with and without X^T X (re-run `calibrate` on both)")
        self.rows += other.rows
        self.samples += other.samples
        self.nonfinite_rows += other.nonfinite_rows

    @property
    def mean_square(self) -> np.ndarray:
        """Per-channel E[x^2] (the imatrix importance of each input channel)."""
        return self.sum_sq / max(self.rows, 1)

    def percentile_absmax(self, percentile: float) -> float:
        """The |x| below which `percentile` % of the values fall (bin upper edge; at most max |x|)."""
        total = int(self.hist.sum())
        if total == 0:
            return 0.0
        k = int(np.searchsorted(np.cumsum(self.hist), total * percentile / 100.0))
        return float(min(hist_edges()[min(k, HIST_BINS - 1)], max(abs(self.min), abs(self.max))))


@dataclass
class KVStats:
    """Per-(kv head, channel) max |x| of one layer's keys or values at valid past positions."""

    absmax: np.ndarray
    positions: int = 0
    samples: int = 0

    def update(self, past: np.ndarray, valid: np.ndarray) -> None:
        x = np.abs(np.asarray(past, dtype=np.float32)).transpose(0, 2, 1, 3)[valid]  # [positions, heads, dim]
        x = np.where(np.isfinite(x), x, 0.0)  # an overflowed key/value would make the cache's scale inf
        np.maximum(self.absmax, x.max(axis=0), out=self.absmax)
        self.positions += int(valid.sum())
        self.samples += int(valid.any(axis=1).sum())  # one per batch row with a past

    def merge(self, other: KVStats) -> None:
        np.maximum(self.absmax, other.absmax, out=self.absmax)
        self.positions += other.positions
        self.samples += other.samples


class Statistics:
    """Every graph's tensor statistics plus the KV-cache statistics of one calibration folder."""

    def __init__(self) -> None:
        self.graphs: dict[str, dict[str, TensorStats]] = {}  # graph (gpt, gpt_fast, head_code) -> tensor -> stats
        self.graph_sha256: dict[str, str] = {}  # graph -> sha256 of the FP32 file the stats were observed on
        self.kv: dict[str, KVStats] = {}  # "{layer}.key" / "{layer}.value"
        self.kv_samples = 0
        self.hessian_graphs: set[str] = set()  # graphs whose MatMul inputs also accumulate X^T X
        self.derived: dict[str, dict[str, str]] = {}  # graph -> its tensor -> the source graph's (`derive`)

    # -- accumulating ----------------------------------------------------------------------------

    def update_graph(self, graph: str, outputs: Mapping[str, np.ndarray], hessian_rows: np.ndarray | None = None,
                     ) -> None:
        tensors = self.graphs.setdefault(graph, {})
        for name, value in outputs.items():
            st = tensors.get(name)
            if st is None:
                st = tensors[name] = TensorStats(int(value.shape[-1]))
                if graph in self.hessian_graphs:
                    st.with_hessian()
            st.update(value, hessian_rows)

    def update_kv(self, feed: Mapping[str, np.ndarray]) -> bool:
        """Fold the past key/values of one plain-GPT feed in; False for a step without a past."""
        mask, first = feed.get("attention_mask"), feed.get("past_key_values.0.key")
        if mask is None or first is None or first.shape[2] == 0:
            return False
        past = first.shape[2]
        valid = np.asarray(mask)[:, :past].astype(bool)  # padded slots hold no real key
        if not valid.any():
            return False
        for name, arr in feed.items():
            if not name.startswith("past_key_values."):
                continue
            layer, kind = name.split(".")[1:3]
            key = f"{layer}.{kind}"
            st = self.kv.get(key)
            if st is None:
                st = self.kv[key] = KVStats(np.zeros((arr.shape[1], arr.shape[3]), np.float32))
            st.update(arr, valid)
        self.kv_samples += int(valid.any(axis=1).sum())
        return True

    def merge(self, other: Statistics) -> None:
        for graph, sha in other.graph_sha256.items():
            if self.graph_sha256.setdefault(graph, sha) != sha:
                raise IntegrityError(f"cannot merge statistics of two different {graph} graphs (sha256 differs)")
        for graph, tensors in other.graphs.items():
            mine = self.graphs.setdefault(graph, {})
            for name, st in tensors.items():
                if name in mine:
                    mine[name].merge(st)
                else:
                    st.flush_hessian()
                    mine[name] = TensorStats(st.channels, st.min, st.max, st.hist.copy(), st.absmax.copy(),
                                             st.sum_sq.copy(), st.rows, st.samples,
                                             None if st.xtx is None else st.xtx.copy(), st.xtx_rows)
        for key, kv in other.kv.items():
            if key in self.kv:
                self.kv[key].merge(kv)
            else:
                self.kv[key] = KVStats(kv.absmax.copy(), kv.positions, kv.samples)
        self.kv_samples += other.kv_samples

    def derive(self, graph: str, source: str, names: Mapping[str, str]) -> None:
        """`graph`'s statistics as copies of `source`'s (`names`: its tensor -> the source tensor holding
        the same activation), without X^T X (its consumers read the source's: `match_tensors`)."""
        src = self.tensors(source)
        self.derived[graph] = {"": source, **names}
        self.graphs[graph] = {
            name: TensorStats(src[s].channels, src[s].min, src[s].max, src[s].hist.copy(), src[s].absmax.copy(),
                              src[s].sum_sq.copy(), src[s].rows, src[s].samples, nonfinite_rows=src[s].nonfinite_rows)
            for name, s in names.items()
        }

    # -- reading ---------------------------------------------------------------------------------

    def source_tensors(self, graph: str) -> tuple[str, dict[str, str]] | None:
        """(source graph, this graph's tensor -> the source's) when `graph`'s statistics were derived."""
        m = self.derived.get(graph)
        return None if not m else (m[""], {k: v for k, v in m.items() if k})

    def tensors(self, graph: str) -> dict[str, TensorStats]:
        if graph not in self.graphs:
            raise ForgeError(f"the calibration statistics have no {graph} graph (re-run `calibrate`)")
        return self.graphs[graph]

    def ranges(self, graph: str, names: Iterable[str], percentile: float | None = None,
               ) -> dict[str, tuple[float, float]]:
        """minmax ranges of the named activation tensors of `graph`; with `percentile`, each side
        clipped to the |x| below which that share of the values fall (from the histogram)."""
        names = list(names)
        tensors = self.tensors(graph)
        missing = sorted(set(names) - set(tensors))
        if missing:
            raise ForgeError(f"the calibration statistics of {graph} lack {len(missing)} MatMul input(s) "
                             f"(first: {missing[0]}): recorded from another graph? re-run `calibrate`")
        if percentile is None:
            return {n: (tensors[n].min, tensors[n].max) for n in names}
        out = {}
        for n in names:
            clip = tensors[n].percentile_absmax(percentile)
            out[n] = (max(tensors[n].min, -clip), min(tensors[n].max, clip))
        return out

    def nonfinite_rows(self) -> dict[str, int]:
        """Per graph, the most activation rows with inf/NaN any tensor left out (0 for a healthy run)."""
        return {g: max((st.nonfinite_rows for st in t.values()), default=0) for g, t in sorted(self.graphs.items())}

    def samples(self, graph: str) -> int:
        return max((st.samples for st in self.tensors(graph).values()), default=0)

    def nbytes(self) -> int:
        total = 0
        for tensors in self.graphs.values():
            for st in tensors.values():
                total += st.hist.nbytes + st.absmax.nbytes + st.sum_sq.nbytes + 64
                total += 0 if st.xtx is None else st.xtx.nbytes
        return total + sum(kv.absmax.nbytes + 16 for kv in self.kv.values())

    # -- storage ---------------------------------------------------------------------------------

    def arrays(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Arrays (for the .npz) and the JSON index describing them, in a fixed order."""
        arrays: dict[str, np.ndarray] = {}
        index: dict[str, Any] = {"schema": STATS_SCHEMA, "graphs": {}, "graph_sha256": dict(self.graph_sha256),
                                 "kv": {}, "kv_samples": self.kv_samples, "derived": self.derived}
        for g in sorted(self.graphs):
            entries = {}
            for i, name in enumerate(sorted(self.graphs[g])):
                st = self.graphs[g][name]
                tag = f"{g}/{i:04d}"
                arrays[f"{tag}.hist"], arrays[f"{tag}.absmax"], arrays[f"{tag}.sum_sq"] = st.hist, st.absmax, st.sum_sq
                entries[name] = {"tag": tag, "channels": st.channels, "min": st.min, "max": st.max,
                                 "rows": st.rows, "samples": st.samples}
                if st.nonfinite_rows:
                    entries[name]["nonfinite_rows"] = st.nonfinite_rows
                if st.xtx is not None:  # symmetric: the upper triangle of each block is enough
                    st.flush_hessian()
                    iu = np.triu_indices(st.xtx.shape[1])
                    arrays[f"{tag}.xtx"] = st.xtx[:, iu[0], iu[1]]
                    entries[name]["hessian_block"] = int(st.xtx.shape[1])
                    entries[name]["hessian_rows"] = st.xtx_rows
            index["graphs"][g] = entries
        for key in sorted(self.kv, key=lambda k: (int(k.split(".")[0]), k)):
            kv = self.kv[key]
            arrays[f"kv/{key}"] = kv.absmax
            index["kv"][key] = {"positions": kv.positions, "samples": kv.samples}
        return arrays, index

    def save(self, path: Path) -> None:
        """Write to `path` (an .npz whose `index` entry is the JSON index); caller makes it atomic."""
        arrays, index = self.arrays()
        blob = np.frombuffer(json.dumps(index, sort_keys=True).encode("utf-8"), dtype=np.uint8)
        with open(path, "wb") as f:
            np.savez(f, index=blob, **arrays)

    @classmethod
    def load(cls, path: Path) -> Statistics:
        try:
            with np.load(path) as z:
                index = json.loads(bytes(z["index"]).decode("utf-8"))
                if index.get("schema") != STATS_SCHEMA:
                    raise ForgeError(f"{path}: statistics schema {index.get('schema')!r} is not {STATS_SCHEMA!r}")
                out = cls()
                out.graph_sha256 = dict(index["graph_sha256"])
                out.kv_samples = int(index["kv_samples"])
                out.derived = {g: dict(m) for g, m in (index.get("derived") or {}).items()}
                for g, entries in index["graphs"].items():
                    out.graphs[g] = {
                        name: TensorStats(e["channels"], e["min"], e["max"], z[f"{e['tag']}.hist"],
                                          z[f"{e['tag']}.absmax"], z[f"{e['tag']}.sum_sq"], e["rows"], e["samples"],
                                          _unpack_xtx(z, e), int(e.get("hessian_rows", 0)))
                        for name, e in entries.items()
                    }
                    for name, e in entries.items():
                        out.graphs[g][name].nonfinite_rows = int(e.get("nonfinite_rows", 0))
                for key, e in index["kv"].items():
                    out.kv[key] = KVStats(z[f"kv/{key}"], e["positions"], e["samples"])
        except ForgeError:
            raise
        except (OSError, ValueError, KeyError, json.JSONDecodeError) as e:
            raise BadInput(f"calibration statistics {path} are unreadable ({e}); re-run `calibrate`") from None
        return out


def _unpack_xtx(z: Any, entry: Mapping[str, Any]) -> np.ndarray | None:
    block = entry.get("hessian_block")
    if block is None:
        return None
    packed = z[f"{entry['tag']}.xtx"]
    iu = np.triu_indices(int(block))
    full = np.zeros((packed.shape[0], block, block), np.float32)
    full[:, iu[0], iu[1]] = packed
    full[:, iu[1], iu[0]] = packed
    return full


def match_tensors(source: Mapping[str, TensorStats], target: Mapping[str, TensorStats],
                  rtol: float = 1e-3) -> dict[str, str]:
    """For each tensor of `target`, the tensor of `source` that is the same activation (same width and
    per-channel mean squares within `rtol` of the largest): e.g. the fused graph's qkv input is gpt's
    q/k/v input. Tensors without a match are left out."""
    out: dict[str, str] = {}
    by_width: dict[int, list[tuple[str, np.ndarray]]] = {}
    for name, st in source.items():
        by_width.setdefault(st.channels, []).append((name, st.mean_square))
    for name, st in target.items():
        ms = st.mean_square
        for cand, cms in by_width.get(st.channels, []):
            scale = float(np.abs(cms).max(initial=0.0))
            if np.allclose(ms, cms, rtol=rtol, atol=1e-12 + rtol * scale):
                out[name] = cand
                break
    return out


def sample_key(seed: int, sentence_sha256: str, component: str, index: int) -> float:
    """The priority of one recorded input in the raw sample: a uniform number in [0, 1) that depends
    only on the seed and what the input is (never on the run or the order), so the smallest keys of
    two merged runs are the smallest keys of one run over both."""
    digest = hashlib.sha256(f"{seed}:{sentence_sha256}:{component}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64
