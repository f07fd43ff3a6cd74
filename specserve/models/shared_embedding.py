"""A trained draft (specserve/train) reuses its target's input embedding instead of carrying a
copy. Its config.json names the target and holds a small probe of that embedding, so loading it
next to another model fails with a clear error instead of proposing nonsense."""

from __future__ import annotations

from pathlib import Path

import torch


def embedding_probe(embedding: torch.Tensor, num_rows: int = 8, num_cols: int = 8) -> dict:
    """A few values of an embedding, saved with a trained draft to recognise its target."""
    rows = torch.linspace(0, embedding.shape[0] - 1, num_rows).long()
    values = embedding[rows, :num_cols].float()
    return {"rows": rows.tolist(), "values": [[round(v, 6) for v in r] for r in values.tolist()]}


def draft_embedding(path: Path, meta: dict, embedding: torch.Tensor | None) -> torch.Tensor:
    """The target's embedding for a trained draft, checked against what it was trained for."""
    target = meta.get("target", "another model")
    if embedding is None:
        raise ValueError(f"{path} is a draft trained for {target} and shares its embedding: use "
                         "it as speculative_config={'method': 'draft', 'model': ...} of that "
                         "target")
    want = (meta["target_vocab_size"], meta["hidden_size"])
    if tuple(embedding.shape) != want:
        raise ValueError(f"{path} was trained for a different target ({target}: vocabulary "
                         f"{want[0]}, hidden size {want[1]}; this target has "
                         f"{embedding.shape[0]}, {embedding.shape[1]})")
    probe = meta.get("target_embedding_probe")
    if probe is not None:
        # bf16 rounding of the same weights stays far inside this tolerance; other weights do not.
        rows = embedding.detach()[torch.tensor(probe["rows"]), : len(probe["values"][0])]
        seen = rows.float().cpu()
        want_v = torch.tensor(probe["values"])
        if not torch.allclose(seen, want_v, rtol=2e-2, atol=1e-2 * float(want_v.abs().max())):
            raise ValueError(f"{path} was trained for a different target ({target}): the "
                             "target's embedding differs from the one it was trained with")
    return embedding.detach()
