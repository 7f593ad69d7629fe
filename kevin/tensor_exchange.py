"""The inputs the judge hands the runner and the outputs it gets back: one block of memory both map; no pickle, no
objects.

The judge lays out a slot for each tensor input and each output of the reference (shape, dtype, byte offset),
allocates the block and
hands the runner a descriptor of it over their socket: on the CPU an anonymous memory file (memfd: no name, no
folder another child could reach); on a GPU device memory, exported as a file descriptor by the CUDA driver's
virtual memory calls (no name either, and no pid: it crosses the sandbox's namespaces as any descriptor does),
so that an output crosses in a copy on the device instead of two trips through host memory (a 268 MB output:
about 0.2 ms against 100 ms or more). Where the driver cannot export device memory, the GPU's block is host
memory too. The judge writes a call's inputs into their slots just before it asks for the call, and the
candidate reads them there (the runner draws nothing, so no code in the candidate's process knows an input
before its call); the runner copies an output into its slot, and the judge copies it out. Only bytes cross, in
the judge's own layout: the runner can put values into the judge's slots, never an object (a view of an input,
a subclass, a buffer it keeps) into the judge's hands.
"""
from __future__ import annotations

import ctypes
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


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocationProp(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("compressionType", ctypes.c_ubyte),
                ("gpuDirectRDMACapable", ctypes.c_ubyte), ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AccessDesc(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


PINNED, POSIX_FD, ON_DEVICE, READ_WRITE = 1, 1, 1, 3  # the driver's enum values for the calls below


class DeviceBlock:
    """`size` bytes of memory on GPU `index`, made by the CUDA driver's virtual memory calls, either new and
    exportable (`fd=None`) or imported from a descriptor another process exported; `tensor` is the whole block
    as bytes. The driver is called directly (torch's IPC needs named files in /dev/shm, which each sandboxed
    child has its own of), on the thread that made the device current."""

    def __init__(self, index: int, size: int, fd: int | None = None):
        self.cuda = ctypes.CDLL("libcuda.so.1")
        prop = _AllocationProp(type=PINNED, requestedHandleTypes=POSIX_FD, location=_Location(ON_DEVICE, index))
        granularity = ctypes.c_size_t()
        self._call("cuMemGetAllocationGranularity", ctypes.byref(granularity), ctypes.byref(prop), 0)
        self.size = -(-size // granularity.value) * granularity.value
        self.handle = ctypes.c_ulonglong()
        if fd is None:
            self._call("cuMemCreate", ctypes.byref(self.handle), ctypes.c_size_t(self.size), ctypes.byref(prop),
                       ctypes.c_ulonglong(0))
        else:
            self._call("cuMemImportFromShareableHandle", ctypes.byref(self.handle), ctypes.c_void_p(fd), POSIX_FD)
            os.close(fd)
        self.pointer = ctypes.c_ulonglong()
        self._call("cuMemAddressReserve", ctypes.byref(self.pointer), ctypes.c_size_t(self.size),
                   ctypes.c_size_t(0), ctypes.c_ulonglong(0), ctypes.c_ulonglong(0))
        self._call("cuMemMap", self.pointer, ctypes.c_size_t(self.size), ctypes.c_size_t(0), self.handle,
                   ctypes.c_ulonglong(0))
        access = _AccessDesc(location=_Location(ON_DEVICE, index), flags=READ_WRITE)
        self._call("cuMemSetAccess", self.pointer, ctypes.c_size_t(self.size), ctypes.byref(access),
                   ctypes.c_size_t(1))
        self.__cuda_array_interface__ = {"shape": (self.size,), "typestr": "|u1", "version": 3, "strides": None,
                                         "data": (self.pointer.value, False)}
        self.tensor = torch.as_tensor(self, device=torch.device("cuda", index))

    def _call(self, name: str, *args) -> None:
        if status := getattr(self.cuda, name)(*args):
            raise OSError(f"{name} failed with CUDA driver error {status}")

    def export(self) -> int:
        """A new file descriptor of this block, for another process to import."""
        fd = ctypes.c_int(-1)
        self._call("cuMemExportToShareableHandle", ctypes.byref(fd), self.handle, POSIX_FD, ctypes.c_ulonglong(0))
        return fd.value


def _map_shared(fd: int, size: int) -> torch.Tensor:
    """The memory file `fd` mapped, as bytes, through libc and not Python's mmap, which keeps a duplicate of the
    descriptor: the runner closes the only one it has, so that no code of its candidate can map these pages again
    at an address of its choosing (seccomp kills mremap's way of doing so)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    address = libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
    if address in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), f"mmap of the shared block: {os.strerror(ctypes.get_errno())}")
    return torch.frombuffer((ctypes.c_uint8 * size).from_address(address), dtype=torch.uint8)


class Arena:
    """The shared block's slots as tensors, in the order of the layout (None where a value has no slot), the first
    `inputs` of them the inputs' and the rest the outputs': in a memory file mapped here, or (`device` given) in a
    `DeviceBlock`."""

    def __init__(self, fd: int, slots: list[dict], device: torch.device | None = None, inputs: int = 0):
        self.layout, self.device, self.input_count, self.nbytes = slots, device, inputs, end_of(slots)
        if device is None:
            self.fd, whole = fd, _map_shared(fd, end_of(slots))
        else:
            index = device.index if device.index is not None else torch.cuda.current_device()
            self.block = DeviceBlock(index, end_of(slots), fd)
            self.fd, whole = None, self.block.tensor
        self.slots = [self._view(whole, slot) for slot in slots]
        self.inputs, self.outputs = self.slots[:inputs], self.slots[inputs:]

    def _view(self, whole: torch.Tensor, slot: dict) -> torch.Tensor | None:
        if not slot:
            return None
        dtype = getattr(torch, slot["dtype"])
        return whole[slot["offset"]:slot["offset"] + _nbytes(slot)].view(dtype).view(slot["shape"])

    @classmethod
    def create(cls, inputs: list, outputs: list, device: torch.device) -> Arena:
        """The judge's side: a fresh block with a slot for each tensor of `inputs` and `outputs`, on `device` where
        it is a GPU whose driver exports device memory, else in a memory file."""
        slots = layout(inputs + outputs)
        if device.type == "cuda":
            try:
                return cls(None, slots, device, len(inputs))
            except (OSError, AttributeError):  # no driver library, or one without the virtual memory calls
                pass
        fd = os.memfd_create("kevin-exchange", os.MFD_CLOEXEC)
        os.ftruncate(fd, end_of(slots))
        return cls(fd, slots, inputs=len(inputs))

    @property
    def message(self) -> dict:
        """What the runner needs beside the descriptor to map the same slots."""
        return {"slots": self.layout, "device": str(self.device) if self.device is not None else None,
                "inputs": self.input_count}

    def send(self, conn) -> None:
        """The descriptor to the other end of `conn` (a socket-backed Connection), right after a message that
        carries `message`."""
        fd = self.block.export() if self.device is not None else self.fd
        try:
            with socket.socket(fileno=os.dup(conn.fileno())) as sock:
                socket.send_fds(sock, [b"f"], [fd])
        finally:
            if self.device is not None:
                os.close(fd)

    @classmethod
    def receive(cls, conn, message: dict) -> Arena:
        """The runner's side, after the judge's arena message: the descriptor that follows it, mapped."""
        with socket.socket(fileno=os.dup(conn.fileno())) as sock:
            _, fds, _, _ = socket.recv_fds(sock, 1, 1)
        if len(fds) != 1:
            raise ValueError("no shared-memory descriptor came with the arena message")
        arena = cls(fds[0], message["slots"], torch.device(message["device"]) if message.get("device") else None,
                    int(message.get("inputs", 0)))
        if arena.fd is not None:  # mapped: the runner keeps no descriptor of it
            os.close(arena.fd)
            arena.fd = None
        return arena
