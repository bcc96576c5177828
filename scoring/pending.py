"""`PendingImages`: a batch's image embeddings on their way from the device to the host, shared by
the scorers (`lait.scoring.model`, `lait.scoring.concepts`)."""

from __future__ import annotations


class PendingImages:
    """Image embeddings (and tokens) on their way to the host: `result()` waits for them."""

    def __init__(self, tensors: tuple, event=None):
        self.tensors, self.event = tensors, event

    @classmethod
    def of(cls, *device_tensors) -> "PendingImages":
        import torch

        if device_tensors[0].device.type != "cuda":
            return cls(tuple(t.numpy() for t in device_tensors))
        host = tuple(torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)
                     for t in device_tensors)
        event = torch.cuda.Event()
        event.record()
        return cls(host, event)

    def result(self):
        if self.event is not None:
            self.event.synchronize()
            self.tensors = tuple(t.numpy() for t in self.tensors)
            self.event = None
        return self.tensors[0] if len(self.tensors) == 1 else self.tensors
