"""Bytes of a QLoRA base: bitsandbytes' 4-bit layout of the quantized Linears, and its dequantization workspace.

``model.lora.quantize`` (:mod:`grasp_lightning.quantization`) turns every ``nn.Linear`` outside
:data:`~grasp_lightning.quantization.SKIP_MODULES` into a ``bitsandbytes.nn.Linear4bit``. Its weight
of ``n = in x out`` values is held as (bitsandbytes 0.50 ``functional.quantize_4bit``, block size 64):

- the packed values, two 4-bit codes a byte: ``ceil(n / 2)`` B (uint8);
- one absmax per block of 64: ``blocks = ceil(n / 64)``, float32 (``4 x blocks`` B); with double
  quantization (``double_quant``) they are 8-bit codes (``blocks`` B) of ``absmax - mean``, with one
  float32 absmax per 256 of them (``4 x ceil(blocks / 256)`` B) and the float32 mean (4 B);
- the 4-bit type's 16 float32 values (``quant_map``, 64 B); double quantization's 256-entry float32
  map is one tensor shared by every layer quantized on a device (1 KiB, not counted).

So NF4 costs 4.5 bits per weight, 4.127 with double quantization. Biases, the vision tower, the LM
head, embeddings and norms stay in ``model.policy.dtype``. Each matrix product dequantizes its
weight to the compute dtype (``MatMul4Bit``, forward and backward alike) and frees it: one layer's
dense weight at a time, the largest quantized Linear's, is the workspace.
"""

from __future__ import annotations

from dataclasses import dataclass

from grasp_lightning.planning.architectures import ParamCounts
from grasp_lightning.quantization import SKIP_MODULES

#: bitsandbytes' block size of 4-bit weights (``Params4bit``'s default) and of double quantization.
BLOCKSIZE, NESTED_BLOCKSIZE = 64, 256
#: Bytes of a 4-bit type's code book (16 float32 values, ``QuantState.code``).
CODE_BYTES = 16 * 4


def quantized_weight_bytes(numel: int, *, double_quant: bool) -> int:
    """Bytes a 4-bit weight of ``numel`` values holds on the GPU (packed values, absmax, code book),
    bitsandbytes' layout (module docstring)."""
    blocks = -(-numel // BLOCKSIZE)
    packed = (numel + 1) // 2
    if double_quant:
        absmax = blocks + 4 * -(-blocks // NESTED_BLOCKSIZE) + 4
    else:
        absmax = 4 * blocks
    return packed + absmax + CODE_BYTES


def quantized_linears(counts: ParamCounts) -> list[tuple[str, int, int]]:
    """The Linears transformers' ``replace_with_bnb_linear`` quantizes: every one whose name
    :data:`~grasp_lightning.quantization.SKIP_MODULES` does not match (transformers'
    ``should_convert_module``: from the start to a module boundary, as a regex, or as a suffix)."""
    from transformers.quantizers.quantizers_utils import should_convert_module

    return [lin for lin in counts.linears if should_convert_module(lin[0], list(SKIP_MODULES))]


@dataclass(frozen=True)
class QuantizedBase:
    """A 4-bit base's weights: ``params`` quantized values in ``bytes`` B, and ``workspace`` B for the
    largest quantized Linear dequantized to ``compute_bytes`` per value."""

    params: int
    bytes: int
    workspace: int


def quantized_base(counts: ParamCounts, *, double_quant: bool, compute_bytes: int) -> QuantizedBase:
    """The quantized Linears' values, their 4-bit bytes and the dequantization workspace."""
    linears = quantized_linears(counts)
    sizes = [fan_in * fan_out for _, fan_in, fan_out in linears]
    return QuantizedBase(params=sum(sizes), bytes=sum(quantized_weight_bytes(n, double_quant=double_quant)
                                                      for n in sizes),
                         workspace=compute_bytes * max(sizes, default=0))
