"""Which kernel variant and which launch configurations run on which GPU: dispatch by capability.

Two variants of the GEMMs, one source each (a ``TMA`` constexpr switches the operand loads):

* ``"hopper"`` — operands (and the W8A8 output tile) through TMA tensor descriptors; capability 9.x only,
  where it was measured faster (docs/KERNELS.md).
* ``"portable"`` — plain pointer loads (cp.async pipelining), nothing Hopper-only: every CUDA GPU of
  capability ≥ 8.0 (Ampere, Ada, Hopper when forced, Blackwell sm_100 / sm_120).

The fused Hadamard + quantize, the engine bookkeeping and the q/k norm kernels use no Hopper-only feature:
one form everywhere. The NVFP4 decode's inline PTX needs the e4m3x2 → f16x2 conversion of sm_89+; below
that the element-wise decode (same bits) runs. ``SIXBIT_KERNEL_VARIANT=portable`` (or ``hopper``) forces a
variant — the way to run the portable kernels on an H200.

Launch configs are chosen by the device's opt-in shared memory per block (:data:`SMEM_OPTIN` for the
targets this project compiles for; the device's own figure at run time): the first entry of a config
ladder whose ``min_smem`` the device has. ``tests/test_kernels_compile.py`` compiles every dispatched
config for sm_80/86/89/90/100/120 and checks its ``metadata.shared`` against the target's budget.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from functools import cache
from typing import NamedTuple

import torch

HOPPER, PORTABLE = "hopper", "portable"
VARIANTS = (HOPPER, PORTABLE)

KB = 1024
#: opt-in shared memory per block (CUDA programming guide), by the capabilities the compile test targets
SMEM_OPTIN = {(8, 0): 163 * KB, (8, 6): 99 * KB, (8, 9): 99 * KB, (9, 0): 227 * KB, (10, 0): 227 * KB,
              (12, 0): 99 * KB}
TARGETS = tuple(SMEM_OPTIN)


class GemmConfig(NamedTuple):
    """Tile shape and launch options of a GEMM kernel."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int


class W4Config(NamedTuple):
    """The per-tile-decode W4 GEMM's config; ``swap`` computes the transposed product (weight as A)."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    swap: bool


class RowsConfig(NamedTuple):
    """Persistent row kernels (quantize, NVFP4 tiles, bookkeeping): rows (or elements) per program step,
    warps, programs per SM."""

    rows: int
    num_warps: int
    waves: int


class DecodeConfig(NamedTuple):
    block_n: int
    block_k: int
    num_warps: int


def pick(ladder, smem: int):
    """First config of ``ladder`` (``[(min_smem, config), ...]``, largest first) the device's ``smem`` allows."""
    for need, cfg in ladder:
        if smem >= need:
            return cfg
    return ladder[-1][1]


@dataclass(frozen=True)
class Target:
    """What the dispatch knows about a device: capability, opt-in shared memory, variant, PTX decode, and
    explicit launch-config overrides (``((key, config), ...)``; keys ``"w8a8"``, ``"w4_tile/<A mode>"``,
    ``"w4_once"``, ``"rows"``, ``"rows_long"``, ``"stats"``, ``"nvfp4_tiles"`` — how a tuning run hands its
    picks to every wrapper, ``ops.linear`` included, without touching module state)."""

    capability: tuple[int, int]
    smem: int
    variant: str
    ptx_decode: bool
    overrides: tuple = ()

    @property
    def name(self) -> str:
        return f"sm_{self.capability[0]}{self.capability[1]}"

    def config(self, key: str, default):
        """The override for ``key``, else ``default``."""
        return dict(self.overrides).get(key, default)

    def with_configs(self, **configs) -> Target:
        """A copy with these overrides added (``w4_tile_0=...`` stands for ``"w4_tile/0"``)."""
        merged = dict(self.overrides)
        merged.update({k.replace("w4_tile_", "w4_tile/"): v for k, v in configs.items()})
        return replace(self, overrides=tuple(sorted(merged.items())))


def default_variant(capability: tuple[int, int]) -> str:
    return HOPPER if capability[0] == 9 else PORTABLE


def target_for(capability: tuple[int, int], smem: int | None = None, variant: str | None = None) -> Target:
    """The dispatch for a capability (``smem`` defaults to :data:`SMEM_OPTIN`, else the smallest budget)."""
    cap = (int(capability[0]), int(capability[1]))
    v = variant or os.environ.get("SIXBIT_KERNEL_VARIANT") or default_variant(cap)
    if v not in VARIANTS:
        raise ValueError(f"kernel variant must be one of {VARIANTS}, got {v!r} (SIXBIT_KERNEL_VARIANT?)")
    if v == HOPPER and cap[0] < 9:
        raise ValueError(f"the hopper kernel variant needs capability >= 9.0 (TMA), this device is {cap}")
    s = smem if smem is not None else SMEM_OPTIN.get(cap, 99 * KB)
    return Target(cap, s, v, ptx_decode=cap >= (8, 9))


#: what the interpreter (CPU tensors) dispatches to when no target is given: the Hopper forms, which the
#: interpreter runs too (TMA descriptors included), so both variants are testable on the CPU
INTERPRETER = Target((9, 0), 227 * KB, HOPPER, ptx_decode=False)


@cache
def _cuda_target(index: int, variant: str | None) -> Target:
    props = torch.cuda.get_device_properties(index)
    smem = getattr(props, "shared_memory_per_block_optin", None)
    return target_for((props.major, props.minor), smem, variant)


def device_target(device, variant: str | None = None) -> Target:
    """The :class:`Target` of a tensor's device (cached per CUDA device; for CPU tensors — the interpreter —
    :data:`INTERPRETER` or the forced variant). ``variant`` (else ``SIXBIT_KERNEL_VARIANT``) forces one."""
    dev = torch.device(device)
    v = variant or os.environ.get("SIXBIT_KERNEL_VARIANT") or None
    if dev.type != "cuda":
        return INTERPRETER if v in (None, HOPPER) else replace(INTERPRETER, variant=v)
    idx = dev.index if dev.index is not None else torch.cuda.current_device()
    return _cuda_target(idx, v)


def resolve(target: Target | None, device, interp: bool) -> Target:
    """``target`` if given; else the device's (the interpreter never uses inline PTX)."""
    t = target or device_target(device)
    return replace(t, ptx_decode=False) if interp and t.ptx_decode else t
