"""Fused DSA metadata copy (docs/spec.md, metadata copy): refresh the static metadata buffers of one or several
attention backends before a CUDA-graph replay, in one launch.

    copy = MetadataCopy([backend0_buffers, backend1_buffers], mode="decode")   # once
    copy(cache_seqlens, cu_seqlens_k, page_indices, dsa_cache_seqlens, dsa_cu_seqlens_k)  # each step

Destination buffers are dicts with keys cache_seqlens, cu_seqlens_k, page_table_1,
dsa_cache_seqlens, dsa_cu_seqlens_k and, as needed, seqlens_expanded, real_page_table,
flashmla_num_splits, flashmla_metadata. Sizes come from the source tensors' shapes.
"""
from __future__ import annotations

import ctypes as C

import torch

from . import _fill_metadata
from ._abi import MAX_DESTINATIONS, MODE_DECODE, MODE_DRAFT_EXTEND, MODE_TARGET_VERIFY, check as _check_status
from ._read import pdl_flag
from ._op import OPS, SIZES, _launch
from ._tensors import _int32, as_tensor, device_index
from .errors import ArgumentTypeError, ArgumentValueError


__all__ = ["MetadataCopy", "metadata_copy", "MODES", "MODE_DECODE", "MODE_TARGET_VERIFY", "MODE_DRAFT_EXTEND"]

MODES = {"decode": MODE_DECODE, "target_verify": MODE_TARGET_VERIFY, "draft_extend": MODE_DRAFT_EXTEND}
_fill_sources = _fill_metadata.fill_metadata_sources  # the compiled judge and filler of a step's sources
_OP = OPS["metadata"]

# (key in a destination dict, C field, kind), in the field order of _fill_metadata.Destinations: kind 1 = 1-D, 2 = 2-D with a row stride, 0 = any
# shape, contiguous, taken flat.
_DEST_FIELDS = (
    ("cache_seqlens", "cache_seqlens", 1),
    ("cu_seqlens_k", "cu_seqlens_k", 1),
    ("page_table_1", "page_table", 2),
    ("seqlens_expanded", "seqlens_expanded", 1),
    ("dsa_cache_seqlens", "dsa_cache_seqlens", 1),
    ("dsa_cu_seqlens_k", "dsa_cu_seqlens_k", 1),
    ("real_page_table", "real_page_table", 2),
    ("flashmla_num_splits", "num_splits", 1),
    ("flashmla_metadata", "flashmla_metadata", 0),
)
_REQUIRED = ("cache_seqlens", "cu_seqlens_k", "page_table_1", "dsa_cache_seqlens", "dsa_cu_seqlens_k")


def _mode_id(mode) -> int:
    if isinstance(mode, str) and mode.lower() in MODES:
        return MODES[mode.lower()]
    if mode in MODES.values():
        return int(mode)
    raise ArgumentValueError("mode", f"mode must be one of {sorted(MODES)} (got {mode!r})")


class MetadataCopy:
    """One bound set of K destination backends (1 <= K <= 8), validated once.

    Each call takes the step's source tensors, checks them (dtype, device, contiguity, shape,
    capacity) and launches one kernel on the current stream (or `stream`)."""

    def __init__(self, destinations, *, mode="decode", pdl=False):
        if isinstance(destinations, dict):
            destinations = [destinations]
        destinations = list(destinations)
        if not 1 <= len(destinations) <= MAX_DESTINATIONS:
            raise ArgumentValueError("destinations", f"destinations: expected 1..{MAX_DESTINATIONS} backends (got {len(destinations)})")
        self.mode = _mode_id(mode)
        self.decode = self.mode == MODE_DECODE
        known = {key for key, _, _ in _DEST_FIELDS}
        for k, dest in enumerate(destinations):
            if not isinstance(dest, dict):
                raise ArgumentTypeError("destinations", f"destinations[{k}] must be a dict of tensors (got {type(dest).__name__})")
            unknown = sorted(str(key) for key in dest if key not in known)
            if unknown:  # a misspelled key would leave its buffer never refreshed
                raise ArgumentValueError(f"destinations[{k}]", f"unknown keys {unknown}; the keys are {[f for f, _, _ in _DEST_FIELDS]}")
        destinations = [{key: (None if t is None else as_tensor(t, f"destinations[{k}]['{key}']"))
                         for key, t in dest.items()} for k, dest in enumerate(destinations)]
        first = destinations[0].get("cache_seqlens")
        if not isinstance(first, torch.Tensor):
            raise ArgumentTypeError("destinations", "destinations[0]['cache_seqlens'] must be a torch.Tensor")
        self.device = first.device
        self._dev = device_index(first)
        present = {key for key, _, _ in _DEST_FIELDS if destinations[0].get(key) is not None}
        self.has_real_page_table = "real_page_table" in present
        self.has_flashmla = "flashmla_num_splits" in present or "flashmla_metadata" in present
        rows = [[None] * len(_DEST_FIELDS) for _ in destinations]
        for k, dest in enumerate(destinations):
            for key in _REQUIRED + (() if self.decode else ("seqlens_expanded",)):
                if dest.get(key) is None:
                    raise ArgumentValueError(f"destinations[{k}]['{key}']", f"required in mode {mode!r} but missing")
            if self.has_flashmla and (dest.get("flashmla_num_splits") is None or dest.get("flashmla_metadata") is None):
                raise ArgumentValueError(f"destinations[{k}]", "the FlashMLA group needs both flashmla_num_splits and flashmla_metadata")
            for i, (key, _, kind) in enumerate(_DEST_FIELDS):
                t = dest.get(key)
                wanted = key in present
                if (t is not None) != wanted:
                    raise ArgumentValueError(f"destinations[{k}]['{key}']", "present in some destinations and not in others; "
                               "every backend must carry the same optional groups")
                if t is None:
                    continue
                self._check_dest(t, f"destinations[{k}]['{key}']", kind)
                rows[k][i] = t
        self._dests = _fill_metadata.Destinations(rows)  # compiled: the dsa_metadata_destination array
        self._keep = destinations
        self._flags = pdl_flag(pdl)
        self._dests_address = self._dests.address
        self._params = C.create_string_buffer(SIZES["metadata"])
        self._address = C.addressof(self._params)
        _fill_metadata.init_metadata(self._address, flags=self._flags, dev=self._dev, mode=self.mode,
                                     num_destinations=len(destinations), destinations=self._dests_address)
        self._last = (None,) * 9  # the source tensors the params were last built from

    def _check_dest(self, t, name, kind):
        if not isinstance(t, torch.Tensor):
            raise ArgumentTypeError(name, f"{name} must be a torch.Tensor (got {type(t).__name__})")
        if t.dtype != _int32:
            raise ArgumentTypeError(name, f"{name} must have dtype torch.int32 (got {t.dtype})")
        if t.device != self.device:
            raise ArgumentValueError(name, f"{name} is on {t.device} but destinations[0]['cache_seqlens'] is on {self.device}")
        if kind == 1 and (t.dim() != 1 or not t.is_contiguous()):
            raise ArgumentValueError(name, f"{name} must be a contiguous 1-D tensor (got shape {list(t.shape)}, strides {t.stride()})")
        if kind == 0 and not t.is_contiguous():
            raise ArgumentValueError(name, f"{name} must be contiguous (got shape {list(t.shape)}, strides {t.stride()})")
        if kind == 2 and (t.dim() != 2 or t.stride(1) != 1):
            raise ArgumentValueError(name, f"{name} must be 2-D with unit column stride (got shape {list(t.shape)}, strides {t.stride()})")

    def __call__(self, cache_seqlens, cu_seqlens_k, page_indices, dsa_cache_seqlens, dsa_cu_seqlens_k,
                 seqlens_expanded=None, real_page_table=None, num_splits=None, flashmla_metadata=None,
                 *, stream=None) -> None:
        """Copies one step's metadata into every bound destination (docs/spec.md, metadata copy).

        Sizes come from the sources' shapes. Sources are checked when they are new tensor
        objects; passing the very same objects as the previous call (static source buffers,
        refilled in place) skips the checks and reuses the prepared launch."""
        last = self._last
        if not (cache_seqlens is last[0] and cu_seqlens_k is last[1] and page_indices is last[2]
                and dsa_cache_seqlens is last[3] and dsa_cu_seqlens_k is last[4] and seqlens_expanded is last[5]
                and real_page_table is last[6] and num_splits is last[7] and flashmla_metadata is last[8]):
            self._prepare(cache_seqlens=cache_seqlens, cu_seqlens_k=cu_seqlens_k, page_indices=page_indices,
                          dsa_cache_seqlens=dsa_cache_seqlens, dsa_cu_seqlens_k=dsa_cu_seqlens_k,
                          seqlens_expanded=seqlens_expanded, real_page_table=real_page_table, num_splits=num_splits,
                          flashmla_metadata=flashmla_metadata)
        self.launch(stream)

    def bind(self, cache_seqlens, cu_seqlens_k, page_indices, dsa_cache_seqlens, dsa_cu_seqlens_k,
             seqlens_expanded=None, real_page_table=None, num_splits=None, flashmla_metadata=None) -> "MetadataCopy":
        """Checks and binds static source buffers (refilled in place each step); launch() then
        copies them with no per-call argument handling. Returns self."""
        self._prepare(cache_seqlens=cache_seqlens, cu_seqlens_k=cu_seqlens_k, page_indices=page_indices,
                      dsa_cache_seqlens=dsa_cache_seqlens, dsa_cu_seqlens_k=dsa_cu_seqlens_k,
                      seqlens_expanded=seqlens_expanded, real_page_table=real_page_table, num_splits=num_splits,
                      flashmla_metadata=flashmla_metadata)
        return self

    def launch(self, stream=None) -> None:
        """Copies the bound sources (see bind) on `stream` (raw handle) or the current stream."""
        if self._last[0] is None:
            raise RuntimeError("MetadataCopy.launch: no sources bound; call bind(...) or call the object with sources")
        status = _launch(_OP, self._address, self._dev, stream)
        if status:
            _check_status(status)

    def fill_flat(self, names: tuple, *, sizes: tuple, sources: tuple) -> None:
        """Sizes given (bs, max_len, max_seqlen_k, expanded), every source taken flat (the convention
        pydsa.sglang speaks; `sources` in _fill_metadata.fill_flat_sources's order): fills one step's
        sources through the compiled filler, which names a wrong one by `names` (the caller's names of
        the nine sources and four sizes); on success they are bound (launch() may run; the next
        __call__ re-checks its sources), on failure nothing is."""
        self._last = (None,) * 9
        _fill_metadata.fill_flat_sources(self._address, decode=self.decode,
                                         has_real_page_table=self.has_real_page_table, has_flashmla=self.has_flashmla,
                                         names=names, sizes=sizes, sources=sources)
        self._last = (True,) + (None,) * 8

    def _prepare(self, **sources) -> None:
        """Judges the sources (an error names the one that is wrong) and fills the params with them through
        the compiled filler; on success they become the bound sources, on failure nothing stays bound."""
        self._last = (None,) * 9
        self._views = _fill_sources(self._address, decode=self.decode, has_real_page_table=self.has_real_page_table,
                                    has_flashmla=self.has_flashmla, **sources)
        self._last = tuple(sources.values())


def metadata_copy(sources: dict, destinations, *, mode="decode", stream=None, pdl=False) -> None:
    """One-shot form: sources is a dict with the __call__ argument names; destinations one dict
    or a list of up to 8."""
    if not isinstance(sources, dict):
        raise ArgumentTypeError("sources", f"sources must be a dict of the source tensors by name (got {type(sources).__name__})")
    MetadataCopy(destinations, mode=mode, pdl=pdl)(stream=stream, **sources)
