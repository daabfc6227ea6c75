"""What of sglang 0.5.23's compressor configurations is pydsa's: the one rule (`outside_pydsa`) that the layer's calls
(which raise NotImplementedError naming what is not pydsa's) and the plugin (which hands such calls back to sglang's
own kernels) apply, and the configuration ints' own checks.
"""
from __future__ import annotations

import torch

from ..errors import ArgumentTypeError, ArgumentValueError
from . import c4 as sglang_c4
from ._args import count_of, described as _described

HEAD_DIM, RATIO = 512, 128
# What of sglang's compressor configurations stays sglang's (outside_pydsa names the one a call has; the plugin
# names them all in its start-up line)
HANDED_BACK = ("the fp4 indexer store", "bf16_store", "the fp8 two-pool store", "the V4.1 cache layouts",
               "c128 head_dims other than 512", "c4 head_dims other than 128, 256 and 512",
               "a kv_score_input other than fp32",
               "the trtllm backend's uniform-fp8 store (its compress_forward runs on pydsa)")


def not_ours(what: str):
    return NotImplementedError(f"pydsa implements sglang's c128 paths (online and offline, fp32 input, head_dim 512) "
                               f"and its c4 path (head_dim 512, 256 or 128), the V4 layout; {what} is not pydsa's: "
                               f"call sglang's own kernel for it")


def outside_pydsa(head_dim=HEAD_DIM, compress_ratio=RATIO, is_online=True, *, indexer=False, bf16_store=False,
                  two_pool=False, layout="V4", input_dtype=None):
    """What in a call's configuration is not pydsa's, or None when all of it is: the one rule this layer's
    calls (which raise NotImplementedError naming it) and the plugin (which passes such calls to sglang's
    own kernels) apply."""
    if compress_ratio == sglang_c4.RATIO:
        if is_online:
            return "is_online=True with compress_ratio 4 (sglang has no online c4)"
        if head_dim not in (128, 256, 512):
            return f"head_dim {head_dim}"
    elif compress_ratio != RATIO:
        return f"compress_ratio {compress_ratio}"
    elif head_dim != HEAD_DIM:  # online or offline alike
        return f"head_dim {head_dim}"
    if input_dtype is not None and input_dtype != torch.float32:
        return f"a {str(input_dtype).replace('torch.', '')} kv_score_input"
    if indexer:
        return "the fp4 indexer store"
    if bf16_store:
        return "bf16_store"
    if two_pool:
        return "the fp8 two-pool store"
    name = str(getattr(layout, "name", layout))
    if name.upper() not in ("V4", "KVLAYOUT.V4"):
        return f"the {name} cache layout"
    return None


def config_int(name: str, x) -> None:
    """A configuration int (head_dim, compress_ratio) is a positive int: another type, or a value no configuration
    has, is refused as such, not taken for a configuration pydsa does not implement (NotImplementedError, which
    the plugin reads as "hand it back to sglang")."""
    if count_of(x) is None:
        raise ArgumentTypeError(name, f"{name} must be an int (got {_described(x)} {x!r})")
    if x < 1:
        raise ArgumentValueError(name, f"{name} must be positive (got {x})")


def check_config(head_dim, compress_ratio, is_online):
    config_int("head_dim", head_dim)
    config_int("compress_ratio", compress_ratio)
    if is_online is not True and is_online is not False:
        raise ArgumentTypeError("is_online", f"is_online must be a bool (got {_described(is_online)} {is_online!r})")
    reason = outside_pydsa(head_dim, compress_ratio, is_online)
    if reason:
        raise not_ours(reason)


# pydsa's argument names as sglang's caller knows them (errors are re-raised in the caller's words), for
