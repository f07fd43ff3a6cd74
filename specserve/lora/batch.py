"""Which rows of a step's flat batch run which adapter, and the updates that adds.

A step mixes requests of many adapters and of none (the base model). Each request's tokens are
contiguous in the flat batch, so an adapter's rows are a few ranges: one adapter over the whole
batch adds its update to every row, a single range to a slice, anything else gathers its rows
and scatters the update back (vLLM's punica kernels do the same per token on a GPU).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specserve.lora.adapter import LoRAAdapter

# Below this many rows a bf16 model's update runs in fp32 on a CPU: torch's bf16 matmuls with a
# rank-16 side cost 27-33 us a linear there against 8-32 us for fp32 (one row: 3x), and from
# 16 rows on bf16 is the faster (a 2-core Zen 5, docs/results/2026-12-07-session48/).
FEW_ROWS = 8


class LoRABatch:
    def __init__(self, groups: list[tuple[LoRAAdapter, slice | torch.Tensor]]):
        self.groups = groups  # (adapter, its rows: a slice or an index tensor)

    @classmethod
    def build(cls, spans: Sequence[tuple[LoRAAdapter | None, int, int]],
              device: torch.device) -> LoRABatch | None:
        """spans: (adapter or None, first row, end row) of each request; None when no row runs
        an adapter (the step then runs as it would without LoRA)."""
        ranges: dict[int, tuple[LoRAAdapter, list[tuple[int, int]]]] = {}
        for adapter, start, end in spans:
            if adapter is not None and end > start:
                ranges.setdefault(id(adapter), (adapter, []))[1].append((start, end))
        groups: list[tuple[LoRAAdapter, slice | torch.Tensor]] = []
        for adapter, rs in ranges.values():
            rs.sort()
            merged = [list(rs[0])]
            for start, end in rs[1:]:
                if start == merged[-1][1]:
                    merged[-1][1] = end
                else:
                    merged.append([start, end])
            if len(merged) == 1:
                rows: slice | torch.Tensor = slice(merged[0][0], merged[0][1])
            else:
                rows = torch.cat([torch.arange(s, e) for s, e in merged]).to(device)
            groups.append((adapter, rows))
        return cls(groups) if groups else None

    def add(self, y: torch.Tensor, x: torch.Tensor, layer: int, name: str) -> torch.Tensor:
        """y (the base linear's output for x) with each adapter's update of linear `name` of
        decoder layer `layer` added to its rows, in place."""
        for adapter, rows in self.groups:
            update = adapter.layers[layer].get(name)
            if update is None:
                continue
            xs = x[rows] if isinstance(rows, slice) else x.index_select(0, rows)
            if update.a32 is not None and len(xs) < FEW_ROWS:
                delta = (xs.float() @ update.a32) @ update.b32
            else:
                delta = (xs @ update.a) @ update.b
            if isinstance(rows, slice):
                y[rows] += delta
            else:
                y.index_add_(0, rows, delta.to(y.dtype))
        return y
