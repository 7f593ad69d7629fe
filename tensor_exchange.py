"""The outputs the runner hands the judge: one anonymous shared-memory file both map; no pickle, no objects.

The judge lays out a slot for each output of the reference (shape, dtype, byte offset), creates a memory file
(memfd: no name, no folder another child could reach) and hands its descriptor to the runner over their
socket. The runner copies an output into its slot (from its device, on a GPU); the judge copies it out. Only
bytes cross, in the judge's own layout: the runner can put values into the judge's slots, never an object (a
view of an input, a subclass, a buffer it keeps) into the judge's hands. Inputs do not cross at all: each side
makes them from the same seed, which the judge draws and tells the runner only as the call is prepared.
"""
from __future__ import annotations

import math
import mmap
import os
import socket

import torch

ALIGN = 64


def _nbytes(slot: dict) -> int:
    return math.prod(slot["shape"]) * torch.empty((), dtype=getattr(torch, slot["dtype"])).element_size()


def layout(values: list) -> list[dict]:
    """A slot (shape, dtype, byte offset) for each tensor in `values`; a value that is not a tensor has none."""
    slots, offset = [], 0
    for value in values:
        if not isinstance(value, torch.Tensor):
            slots.append({})
            continue
        slot = {"shape": list(value.shape), "dtype": str(value.dtype).removeprefix("torch."), "offset": offset}
        slots.append(slot)
        offset += -(-_nbytes(slot) // ALIGN) * ALIGN
    return slots


def end_of(slots: list[dict]) -> int:
    return max([ALIGN] + [-(-(s["offset"] + _nbytes(s)) // ALIGN) * ALIGN for s in slots if s])


class Arena:
    """The shared file's slots as tensors, in the order of the layout (None where a value has no slot)."""

    def __init__(self, fd: int, slots: list[dict]):
        self.fd, self.layout = fd, slots
        self.map = mmap.mmap(fd, end_of(slots))
        self.slots = [self._view(slot) for slot in slots]

    def _view(self, slot: dict) -> torch.Tensor | None:
        if not slot:
            return None
        dtype, count = getattr(torch, slot["dtype"]), math.prod(slot["shape"])
        if count == 0:
            return torch.empty(slot["shape"], dtype=dtype)
        return torch.frombuffer(self.map, dtype=dtype, count=count, offset=slot["offset"]).view(slot["shape"])

    @classmethod
    def create(cls, values: list) -> Arena:
        """The judge's side: a fresh memory file with a slot for each tensor of `values`."""
        slots = layout(values)
        fd = os.memfd_create("kevin-outputs", os.MFD_CLOEXEC)
        os.ftruncate(fd, end_of(slots))
        return cls(fd, slots)

    def send(self, conn) -> None:
        """The descriptor to the other end of `conn` (a socket-backed Connection), right after a message that
        carries the layout."""
        with socket.socket(fileno=os.dup(conn.fileno())) as sock:
            socket.send_fds(sock, [b"f"], [self.fd])

    @classmethod
    def receive(cls, conn, message: dict) -> Arena:
        """The runner's side, after the judge's arena message: the descriptor that follows it, mapped."""
        with socket.socket(fileno=os.dup(conn.fileno())) as sock:
            _, fds, _, _ = socket.recv_fds(sock, 1, 1)
        if len(fds) != 1:
            raise ValueError("no shared-memory descriptor came with the arena message")
        return cls(fds[0], message["slots"])
