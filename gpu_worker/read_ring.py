"""The loader's per-thread ring of host buffers (:class:`ReadRing`).

What the loader (gpu_worker/loader.py) uses when it cannot read straight into the destination (a CUDA
device): each reader thread owns ``depth`` host buffers (pinned when CUDA is present); it reads a chunk
into one buffer while the previous ones are still being copied to the device with ``non_blocking``
copies on the thread's side stream. A buffer is reused only once its copy has completed (a CUDA event),
so the pool stays bounded at ``threads x depth x chunk_bytes``. On a CPU target the same ring runs with
a synchronous ``copy_`` (tests use it to exercise the logic the CUDA path shares).

It lives beside the loader, not in gpu_worker/host_cache.py (the node's host cache), because the host cache
reads through the loader: the ring there made an import circle loader <-> host cache.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class ReadRing:
    """``depth`` host buffers of ``chunk_bytes`` owned by one reader thread.

    ``acquire()`` returns the index of a free buffer (waiting for its previous device copy);
    ``submit(i, segments)`` copies byte ranges of ``buffer[i]`` into destination byte ranges and
    marks the buffer busy until the copy completes; ``drain()`` waits for every copy of this ring.
    """

    def __init__(
        self,
        chunk_bytes: int,
        depth: int,
        device: torch.device,
        *,
        pin: bool | None = None,
        after: torch.cuda.Stream | None = None,
    ):
        if chunk_bytes <= 0 or depth <= 0:
            raise ValueError("chunk_bytes and depth must be positive")
        self.device = device
        self.cuda = device.type == "cuda"
        pin = self.cuda if pin is None else pin
        self.buffers = [torch.empty(chunk_bytes, dtype=torch.uint8, pin_memory=pin) for _ in range(depth)]
        # numpy views give preadv a writable buffer over the tensor's own memory.
        self.views = [memoryview(b.numpy()) for b in self.buffers]
        self.events: list[torch.cuda.Event | None] = [None] * depth
        self.stream = torch.cuda.Stream(device=device) if self.cuda else None
        if self.stream is not None:
            # Destinations were allocated on the current stream: order our copies after that.
            self.stream.wait_stream(after if after is not None else torch.cuda.current_stream(device))
        self._next = 0

    @property
    def nbytes(self) -> int:
        return sum(b.numel() for b in self.buffers)

    def acquire(self) -> int:
        i = self._next
        self._next = (i + 1) % len(self.buffers)
        ev = self.events[i]
        if ev is not None:
            ev.synchronize()  # the buffer's previous H2D copy must finish before we overwrite it
            self.events[i] = None
        return i

    def submit(self, i: int, segments: Sequence[tuple[torch.Tensor, int, int, int]]) -> None:
        """Copy ``buffer[i][buf_off:buf_off+n]`` to ``dest[dest_off:dest_off+n]`` for each segment."""
        buf = self.buffers[i]
        if self.stream is None:
            for dest, dest_off, buf_off, n in segments:
                dest[dest_off : dest_off + n].copy_(buf[buf_off : buf_off + n])
            return
        with torch.cuda.stream(self.stream):
            for dest, dest_off, buf_off, n in segments:
                dest[dest_off : dest_off + n].copy_(buf[buf_off : buf_off + n], non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(self.stream)
        self.events[i] = ev

    def drain(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()
        self.events = [None] * len(self.buffers)

    def close(self) -> None:
        try:
            self.drain()
        finally:
            for v in self.views:
                v.release()
            self.views = []
            self.buffers = []
