"""cubert: GPU and CPU compute from Python.

Clients, buffers, kernels in cube C, launches, streams and events, graphs,
profiling, memory reports and DLPack, over cubert's C API (docs/python.md).
"""

import contextlib as _contextlib
import threading as _threading

from . import errors
from ._cubert import (Buffer, Client, Event, Graph, Kernel, Profile,
                      RawKernel, Stream, backends, devices)
from .errors import *  # noqa: F401,F403 - the exception classes

__all__ = [
    "Buffer", "Client", "Event", "Graph", "Kernel", "Profile", "RawKernel",
    "Stream", "backends", "devices",
    "dry_run", "from_dlpack", "default_client",
] + errors.__all__

__version__ = "0.1.0"

_defaults = {}
_defaults_lock = _threading.Lock()

_DL_NAMES = {1: "cpu", 2: "cuda"}


def default_client(device=None):
    """A client of `device` opened once per process and kept (the one
    from_dlpack uses when given none)."""
    key = device or ""
    with _defaults_lock:
        client = _defaults.get(key)
        if client is None or client.closed:
            client = Client(device)
            _defaults[key] = client
        return client


def from_dlpack(obj, client=None):
    """A Buffer over the memory of a DLPack producer (anything with
    __dlpack__; a bare DLPack capsule with `client` given), nothing
    copied. Without `client`, a client of the producer's device
    (default_client). A tensor that is not dense and row-major, or whose
    element type cubert has no dtype for, is refused (BufferError)."""
    if client is None:
        if not hasattr(obj, "__dlpack_device__"):
            raise TypeError("cubert: from_dlpack of an object without "
                            "__dlpack_device__ (a bare capsule) needs a "
                            "client")
        kind, index = obj.__dlpack_device__()
        name = _DL_NAMES.get(int(kind))
        if name is None:
            raise BufferError(f"cubert: no backend for DLPack device {kind}")
        client = default_client(f"{name}:{int(index)}")
    return client.from_dlpack(obj)


@_contextlib.contextmanager
def dry_run(client):
    """Within the block, launches and allocations of `client` on this
    thread are validated and recorded but not run (cube_dry_run_begin)."""
    client._dry_run_begin()
    try:
        yield client
    finally:
        client._dry_run_end()


def _client_dry_run(self):
    return dry_run(self)


Client.dry_run = _client_dry_run


@_contextlib.contextmanager
def _client_range(self, name):
    """A named range of this thread in the trace around the block
    (cube_range_push / cube_range_pop); nothing without a trace."""
    self._range_push(name)
    try:
        yield self
    finally:
        self._range_pop()


Client.range = _client_range
