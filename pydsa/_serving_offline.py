"""The serving loop (pydsa/_serving.py) over sglang's default c128 layer: the offline compressor (docs/spec.md,
"The offline c128 compressor"), `--config default` of `python -m pydsa demo` and `python -m pydsa soak`.

The layer's state is a C128Ring, request-scoped: main slot s owns ring rows s*R .. s*R+R-1 (R = 256 when
speculative steps run, so a verify's drafts past a chunk end never overwrite the rows of the chunk a rejection
returns to; else 128). A prefill is a c128_offline_extend over a pyplan.plan_c128_offline plan; a plain decode
is c128_offline_decode by seq_lens and slots; a speculative step is an extend over each request's drafts (1..V)
with no commit: a random number of them is accepted, and the next step restarts at the first rejected
position, whose rows it writes again. Every chunk a draft closes is computed and stored (the rejected ones'
too, as the online verify does). Observers see the same Launches; there is no commit, so no fault that needs
one (`leak`).
"""
from __future__ import annotations

import numpy as np
import torch

import pyplan

from ._abi import CHUNK
from ._serving import Launch, ServingLoop, Step, Workload, bucket
from .c128_offline import C128Ring, c128_offline_decode, c128_offline_extend
from .errors import ArgumentValueError

CONFIGS = ("online", "default")
SPECULATIVE_RING = 256  # R under speculative steps (sglang's): a verify's drafts past a chunk end fit  # online: the online compressor (sglang's flag set); default: sglang's default


def serving_loop(config: str, w: Workload, device, **kwargs) -> ServingLoop:
    """The serving loop of a configuration (one of CONFIGS); a `leak` under "default" is refused naming it."""
    if config not in CONFIGS:
        raise ArgumentValueError("config", f"config must be one of {', '.join(CONFIGS)} (got {config!r})")
    if config == "online":
        return ServingLoop(w, device, **kwargs)
    if kwargs.get("leak"):
        raise ArgumentValueError("leak", "the fault leak commits rejected drafts, and config \"default\" (the "
                                 "offline c128 compressor) has no commit: run it with config \"online\"")
    return OfflineServingLoop(w, device, **kwargs)


def ragged_rows(plan) -> np.ndarray:
    """The ragged input row of each compress record of a plan, in output row order."""
    rec = np.asarray(plan[0]).view(np.uint32).reshape(-1, 4)
    return (rec[rec[:, 0] != 0xFFFFFFFF, 1] & 0xFFFF).astype(np.int64)


class OfflineServingLoop(ServingLoop):
    """The serving loop with an offline c128 layer (sglang's default configuration)."""
    config = "default"

    def _make_layer(self) -> None:
        w, r, f32 = self.w, self.w.max_running, dict(dtype=torch.float32, device=self.device)
        self.ring_size = SPECULATIVE_RING if w.drafts else CHUNK
        ring = torch.full((r * self.ring_size, 2 * w.head_dim), float("nan"), **f32)  # unwritten rows fail the checks
        self.ring = C128Ring(ring, self.ape, store=self.store, ring_size=self.ring_size)
        self.out_pre = torch.empty(w.token_budget // CHUNK + r, w.head_dim, **f32)  # a step closes at most this many
        self.decode_ops = {b: (torch.empty(b, 2 * w.head_dim, **f32), torch.empty(b, w.head_dim, **f32))
                           for b in (1 << i for i in range(r.bit_length()))}
        self.drafts_kv = torch.empty(r * w.drafts, 2 * w.head_dim, **f32)
        self.drafts_out = torch.empty(r * w.drafts // CHUNK + r, w.head_dim, **f32)
        self.plans: dict = {}  # launch kind -> this step's plan

    def _plan(self, kind: str, seq_lens, extend, slots) -> np.ndarray:
        plan = pyplan.plan_c128_offline(seq_lens, extend, slots, ring_size=self.ring_size,
                                        num_slots=self.w.max_running, num_tokens=int(extend.sum()))
        self.plans[kind] = plan if self.device.type == "cpu" else plan.to(self.device)
        return ragged_rows(plan)

    def _plan_records(self, seq_lens, extend, pre) -> np.ndarray:
        return self._plan("prefill", seq_lens, extend, pre)

    def _plan_decode(self, dec: np.ndarray, step: Step) -> None:
        super()._plan_decode(dec, step)
        self.staging.set32("decode_slots", np.concatenate([dec, np.full(bucket(len(dec)) - len(dec), -1)]),
                           bucket(len(dec)))  # padding: slot -1, not held here

    def _plan_verify(self, dec: np.ndarray, step: Step) -> None:
        """An extend over each request's drafts (1..V), a random number of them accepted; nothing committed."""
        st, at = self.staging, self.done[dec]
        lens, accepted = self._draw_drafts(dec, at, least=1)
        n = int(lens.sum())
        first = np.cumsum(lens) - lens
        draft = np.arange(n) - np.repeat(first, lens)
        owner, position = np.repeat(dec, lens), np.repeat(at, lens) + draft
        ragged = self._plan("verify", at + lens, lens, dec)
        out_row, cache_slot = np.full(n, -1, np.int64), np.full(n, -1, np.int64)
        out_row[ragged], cache_slot[ragged] = np.arange(len(ragged)), self._cache_slots(len(ragged))
        st.h64[st.i64["verify_cache"]:st.i64["verify_cache"] + n] = cache_slot
        step.launches.append(Launch(kind="verify", kv=self.drafts_kv[:n], out=self.drafts_out, owner=owner,
                                    position=position, committed=draft < np.repeat(accepted, lens), out_row=out_row,
                                    cache_slot=cache_slot, requests=dec, advance=accepted, pool_at=self._pool_at(),
                                    lens=lens))

    def _run_ops(self, launch: Launch) -> None:
        n, c, st, ring = len(launch.owner), self.counts, self.staging, self.ring
        if launch.kind == "decode":
            kw = dict(out=launch.out, seq_lens=st.view32("decode_seq", n), slots=st.view32("decode_slots", n),
                      cache_slots=st.view64("decode_cache", n), error_count=self.errors)
            self.launch("decode", lambda: c128_offline_decode(ring, launch.kv, **kw))
            c["decode_steps"] += 1
            return
        plan, cache = self.plans.pop(launch.kind), "prefill_cache" if launch.kind == "prefill" else "verify_cache"
        kw = dict(out=launch.out[:int(np.count_nonzero(launch.out_row >= 0))], cache_slots=st.view64(cache, n),
                  error_count=self.errors)
        self.launch(launch.kind, lambda: c128_offline_extend(ring, launch.kv, plan, **kw))
        if launch.kind == "prefill":
            c["prefill_launches"] += 1
            return
        c["verify_steps"] += 1
        c["drafts_accepted"] += int(launch.advance.sum())
        c["drafts_rejected"] += int((launch.lens - launch.advance).sum())
