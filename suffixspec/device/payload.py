"""The host's update to the device's drafting state: one fixed-size int32 buffer per step.

The feeder (on the host) packs, into a pinned buffer, everything the device's
drafting state learns in a step: fresh windows for some request slots, the
step's cost threshold, the calibration table's rows that changed (those
the step's scoring counted, and at first those a table loaded from the
pool holds), the arbiter's choices, the one-token
paths that changed, finished outputs for the device corpus (with their
hash buckets, computed here), the family rows of requests that
started, and after a ``forget`` in the pool the ranges of the corpus ring
and of the one-token paths to clear (and every slot's family row).  The worker copies the buffer to the device (no wait) and, with
tensor parallelism, broadcasts it from rank 0 on the tensor-parallel group:
every size is fixed, so every rank applies the same bytes the same way.
``apply`` writes it into the state with torch ops of fixed shapes: entries a
step does not use name a trash row, and a window row or family row whose
slot was taken by another request since (its epoch differs) goes to the
trash row too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from suffixspec.device.spec import PARAMS, W_FIELDS, WindowSpec
from suffixspec.native import arbiter, calibration as cal
from suffixspec.native.vllm_suffix import SLOTS, pack_doc

if TYPE_CHECKING:  # the packing side (the feeder) runs without torch
    import torch

    from suffixspec.device.corpus import DeviceCorpus, OneTokenPaths
    from suffixspec.device.layout import Calibration, DeviceWindows


@dataclass(frozen=True)
class PayloadSpec:
    """Room per step: window ``rows``, one-token ``paths``, corpus
    ``doc_tokens``, ``family_rows`` (none where the window spec has no family
    row), calibration ``table_rows`` (rows that changed; more wait a step)."""

    window: WindowSpec
    rows: int = 64
    paths: int = 512
    doc_tokens: int = 4096
    family_rows: int = 8
    table_rows: int = 8192
    clear_ring: int = 1 << 16    # corpus ring positions one payload clears, at most
    clear_paths: int = 1 << 14   # one-token path rows one payload clears, at most

    def sections(self) -> dict[str, tuple[int, ...]]:
        w = self.window
        f = self.family_rows if w.family else 0
        return {
            "header": (4,),                       # step, rows used, paths used, tokens used
            # After a forget: ring positions and path rows [from, to) to clear, and
            # 1 to clear every slot's family row.
            "clear": (5,),
            "slots": (self.rows,), "epochs": (self.rows,),
            "win_tokens": (self.rows, w.rows, w.width), "win_c": (self.rows, w.rows, w.width),
            "win_n": (self.rows, w.rows, w.width), "win_meta": (self.rows, w.rows, W_FIELDS),
            "params": (PARAMS,),                  # float32 bits
            "table_idx": (self.table_rows,),      # the rows (TABLE_ROWS: unused)
            "table": (self.table_rows, 2),        # their values, float32 bits
            "prefer": (arbiter.ARB_ROWS,),        # the arbiter's choice per cell (0 or 1)
            "path_keys": (self.paths,), "path_tokens": (self.paths, w.k),
            "path_c": (self.paths, w.k), "path_n": (self.paths, w.k),
            # Corpus: per token its ring position, token, buckets, document, keys.
            "doc_pos": (self.doc_tokens,), "doc_tok": (self.doc_tokens,),
            "doc_b4": (self.doc_tokens,), "doc_b2": (self.doc_tokens,),
            "doc_seq": (self.doc_tokens,), "doc_keys": (self.doc_tokens,),
            # Family rows: slot, epoch, length, tokens (-1 past the length).
            "fam_slots": (f,), "fam_epochs": (f,), "fam_len": (f,),
            "fam_tokens": (f, max(w.family, 1)),
        }

    @property
    def size(self) -> int:
        return sum(int(np.prod(s)) for s in self.sections().values())


def views(buffer, spec: PayloadSpec) -> dict:
    """Named views of a payload ``buffer`` (numpy or torch, int32, ``[size]``)."""
    out, at = {}, 0
    for name, shape in spec.sections().items():
        n = int(np.prod(shape))
        out[name] = buffer[at:at + n].reshape(shape)
        at += n
    return out


class Packer:
    """Fills a host payload buffer (the feeder's side).  ``trash_slot`` and
    ``trash_key`` are the rows unused entries name; the ring bookkeeping of
    the device corpus (``head``, ``docs``) lives here."""

    def __init__(self, spec: PayloadSpec, trash_slot: int, trash_key: int, corpus_tokens: int,
                 corpus_buckets: int):
        self.spec = spec
        self.trash_slot, self.trash_key = trash_slot, trash_key
        self.capacity = corpus_tokens
        self.buckets = corpus_buckets
        self.head = 0
        self.docs = 0

    def clear(self, v: dict) -> None:
        """A step's delta sections emptied (every entry names the trash rows)."""
        v["header"][:] = 0
        v["clear"][:] = 0
        v["table_idx"][:] = cal.TABLE_ROWS  # the table's trash row
        v["slots"][:] = self.trash_slot
        v["epochs"][:] = -1
        v["path_keys"][:] = self.trash_key
        v["doc_pos"][:] = self.capacity  # the ring's trash position
        v["doc_keys"][:] = 0
        v["fam_slots"][:] = self.trash_slot
        v["fam_epochs"][:] = -1
        v["fam_len"][:] = 0

    def put_family(self, v: dict, slot: int, epoch: int, row: np.ndarray) -> bool:
        """Add a slot's family row (``layout.family_row``) to the step's family
        section; False when the section is full (it waits for the next step)."""
        taken = v["fam_epochs"] >= 0
        free = np.flatnonzero(~taken)
        if free.shape[0] == 0:
            return False
        i = int(free[0])
        n = min(row.shape[0], v["fam_tokens"].shape[1])
        v["fam_slots"][i] = slot
        v["fam_epochs"][i] = epoch
        v["fam_len"][i] = n
        v["fam_tokens"][i, :n] = row[row.shape[0] - n:]
        v["fam_tokens"][i, n:] = -1
        return True

    def put_doc(self, v: dict, doc: np.ndarray) -> bool:
        """Add one finished output to the step's corpus section; False when the
        section is full (it waits for the next step).  Only its newest tokens
        that the ring and an empty section hold are kept, so that a long
        output never blocks those after it."""
        used = int(v["header"][3])
        cap = self.capacity
        room = min(cap, self.spec.doc_tokens) - 1
        doc = doc[max(doc.shape[0] - room, 0):]
        n = doc.shape[0]
        if cap <= 1 or used + n + 1 > self.spec.doc_tokens:
            return cap <= 1
        if self.head + n + 1 > cap:
            self.head = 0
        at = slice(used, used + n + 1)
        if not pack_doc(np.ascontiguousarray(doc, np.int32), self.head, self.docs, self.buckets,
                        v["doc_pos"][at], v["doc_tok"][at], v["doc_b4"][at], v["doc_b2"][at],
                        v["doc_seq"][at], v["doc_keys"][at]):
            raise ValueError(f"the corpus section cannot take a document of {n} tokens")
        v["header"][3] = used + n + 1
        self.head += n + 1
        self.docs += 1
        return True


def apply(payload: torch.Tensor, spec: PayloadSpec, windows: DeviceWindows,
          calibration: Calibration, paths: OneTokenPaths | None,
          corpus: DeviceCorpus | None) -> None:
    """Write ``payload`` (a device tensor) into the drafting state, fixed shapes only."""
    import torch
    v = views(payload, spec)
    _clear(v["clear"].to(torch.int64), spec, windows, paths, corpus)
    slots = v["slots"].to(torch.int64)
    live = v["epochs"] == windows.epoch[slots]
    dst = torch.where(live, slots, windows.epoch.shape[0] - 1)  # the trash slot
    windows.tokens[dst] = v["win_tokens"]
    windows.c[dst] = v["win_c"]
    windows.n[dst] = v["win_n"]
    windows.meta[dst] = v["win_meta"]
    if v["fam_slots"].shape[0]:
        slots = v["fam_slots"].to(torch.int64)
        live = v["fam_epochs"] == windows.epoch[slots]
        dst = torch.where(live, slots, windows.epoch.shape[0] - 1)
        windows.family[dst] = v["fam_tokens"]
        windows.family_len[dst] = v["fam_len"]
    calibration.params.copy_(v["params"].view(torch.float32).to(calibration.params.dtype))
    rows = v["table_idx"].to(torch.int64).clamp(0, cal.TABLE_ROWS)
    calibration.table.index_copy_(0, rows,
                                  v["table"].view(torch.float32).to(calibration.table.dtype))
    calibration.prefer.copy_(v["prefer"])
    if paths is not None and paths.tokens.shape[0]:
        paths.put(v["path_keys"], v["path_tokens"], v["path_c"], v["path_n"])
    if corpus is not None and corpus.capacity > 1:
        corpus.put(v["doc_pos"], v["doc_tok"], v["doc_b4"], v["doc_b2"], v["doc_seq"],
                   v["doc_keys"])


__all__ = ["Packer", "PayloadSpec", "SLOTS", "apply", "views"]


def _clear(clear: torch.Tensor, spec: PayloadSpec, windows: DeviceWindows,
           paths: OneTokenPaths | None, corpus: DeviceCorpus | None) -> None:
    """What a ``forget`` asks the device to drop, fixed shapes: corpus ring
    positions ``clear[0]:clear[1]`` (their tokens -1: every candidate there
    then fails its check), one-token path rows ``clear[2]:clear[3]``, and
    every slot's family row when ``clear[4]``.  Unused entries name the trash
    position and row."""
    import torch

    windows.family_len.mul_((clear[4] == 0).to(windows.family_len.dtype))
    if corpus is not None and corpus.capacity > 1:
        at = clear[0] + torch.arange(spec.clear_ring, device=clear.device)
        corpus.tokens.index_fill_(0, torch.where(at < clear[1], at, corpus.capacity), -1)
    if paths is not None and paths.tokens.shape[0] > 1:
        at = clear[2] + torch.arange(spec.clear_paths, device=clear.device)
        paths.n.index_fill_(0, torch.where(at < clear[3], at, paths.vocab), 0)
