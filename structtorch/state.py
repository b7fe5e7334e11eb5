"""Per-example state: tensors indexed by the training example index (warm-start messages, dual variables).

One reusable piece for every learner that keeps something per training example (Full's smoothed-LP
messages, the BCFW dual state, Domke's messages):

- **checkpointed**: every field is a persistent buffer, so it is saved with the model and restored
  on resume (the store is resized to the checkpoint's shape when loaded);
- **rank-correct**: under data parallelism each process updates different examples; ``set``
  all-gathers the (index, value) pairs so every process holds the same, complete store, and a
  checkpoint written by rank 0 holds every example;
- **grows on demand**: rows that were never written read as the field's ``fill`` value.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["ExampleState"]


class ExampleState(nn.Module):
    """Named per-example tensors ``[N, *shape]``.

    >>> state = ExampleState()
    >>> state.add("messages", shape=(15, 2, 2))
    >>> m = state.get("messages", index)           # [B, 15, 2, 2] (fill value for unseen examples)
    >>> state.set("messages", index, new_messages)  # all-gathered under DDP
    """

    def __init__(self) -> None:
        super().__init__()
        self._fill: dict[str, float] = {}
        self._shape: dict[str, tuple[int, ...]] = {}

    def add(self, name: str, shape: tuple[int, ...], fill: float = 0.0, dtype: torch.dtype = torch.float32) -> None:
        """Declare a field of per-example shape ``shape`` (no rows allocated yet)."""
        if name in self._shape:
            raise ValueError(f"ExampleState: field {name!r} already exists")
        self._fill[name], self._shape[name] = float(fill), tuple(int(s) for s in shape)
        self.register_buffer(name, torch.zeros(0, *shape, dtype=dtype), persistent=True)

    def num_examples(self, name: str) -> int:
        """Rows allocated for ``name`` (1 + the largest index written so far, rounded up)."""
        return int(self._buffer(name).shape[0])

    def get(self, name: str, index: torch.Tensor) -> torch.Tensor:
        """Rows ``index`` [B] of field ``name``: [B, *shape] (the fill value where never written)."""
        buf = self._buffer(name)
        index = self._check_index(index, buf.device)
        out = buf.new_full((len(index), *self._shape[name]), self._fill[name])
        seen = index < buf.shape[0]
        out[seen] = buf[index[seen]]
        return out

    def set(self, name: str, index: torch.Tensor, value: torch.Tensor) -> None:
        """Write rows ``index`` [B] of ``name`` with ``value`` [B, *shape] (on every process under DDP)."""
        buf = self._buffer(name)
        index = self._check_index(index, buf.device)
        value = value.detach()
        if value.shape != (len(index), *self._shape[name]):
            raise ValueError(f"ExampleState.set({name!r}): value must have shape "
                             f"[{len(index)}, {', '.join(map(str, self._shape[name]))}], got {tuple(value.shape)}")
        index, value = _all_gather_rows(index, value.to(buf.dtype))
        if len(index) == 0:
            return
        need = int(index.max()) + 1
        if need > buf.shape[0]:
            grown = buf.new_full((max(need, 2 * buf.shape[0]), *self._shape[name]), self._fill[name])
            grown[: buf.shape[0]] = buf
            buf = grown
        buf[index] = value
        setattr(self, name, buf)

    def reset(self, name: str) -> None:
        """Forget every row of ``name`` (all read as the fill value again)."""
        buf = self._buffer(name)
        setattr(self, name, buf.new_zeros(0, *self._shape[name]))

    # ------------------------------------------------------------------ internals
    def _buffer(self, name: str) -> torch.Tensor:
        if name not in self._shape:
            raise KeyError(f"ExampleState has no field {name!r}; fields: {sorted(self._shape)}")
        return getattr(self, name)

    @staticmethod
    def _check_index(index: torch.Tensor, device: torch.device) -> torch.Tensor:
        if not isinstance(index, torch.Tensor) or index.dim() != 1 or index.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"ExampleState: index must be an integer tensor of shape [B], got "
                            f"{getattr(index, 'dtype', type(index))} {tuple(getattr(index, 'shape', ()))}")
        if len(index) and int(index.min()) < 0:
            raise ValueError(f"ExampleState: index values (example indices) must be >= 0, got {int(index.min())}")
        return index.to(device=device, dtype=torch.long)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs) -> None:
        for name in self._shape:  # resize to the checkpoint's number of rows before the copy
            saved = state_dict.get(prefix + name)
            if saved is not None and saved.shape[1:] == self._buffer(name).shape[1:]:
                setattr(self, name, torch.empty_like(saved, device=self._buffer(name).device))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)


def _all_gather_rows(index: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenate (index [B_r], value [B_r, ...]) of every process (B_r may differ); identity without DDP."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return index, value
    world = dist.get_world_size()
    size = torch.tensor([len(index)], device=index.device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size)
    most = int(max(s.item() for s in sizes))
    pad_i = index.new_zeros(most)
    pad_i[: len(index)] = index
    pad_v = value.new_zeros(most, *value.shape[1:])
    pad_v[: len(index)] = value
    all_i = [torch.empty_like(pad_i) for _ in range(world)]
    all_v = [torch.empty_like(pad_v) for _ in range(world)]
    dist.all_gather(all_i, pad_i)
    dist.all_gather(all_v, pad_v)
    keep = [slice(0, int(s.item())) for s in sizes]
    return (torch.cat([i[k] for i, k in zip(all_i, keep)]), torch.cat([v[k] for v, k in zip(all_v, keep)]))
