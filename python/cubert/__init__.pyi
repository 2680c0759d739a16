"""Type stubs of cubert's public API (docs/python.md)."""

import builtins
from contextlib import AbstractContextManager
from types import TracebackType
from typing import (Any, Literal, Protocol, Sequence, SupportsIndex, TypedDict,
                    Union, final)

import numpy as np
from typing_extensions import Self

from . import errors as errors

__version__: str
__all__ = [
    "Buffer", "Client", "Event", "Graph", "Kernel", "Profile", "RawKernel",
    "Stream", "backends", "devices", "dry_run", "from_dlpack",
    "default_client",
    "Error", "InvalidArgumentError", "NotFoundError", "OutOfMemoryError",
    "BufferTooBigError", "PoolCapacityExceededError", "CompileError",
    "ResourceLimitError", "UnsupportedError", "GraphStateError",
    "DeviceFaultError", "SeveralError", "IoError", "UnavailableError",
    "InternalError", "StorageMappingFailedError", "ProfileError",
    "PoolsInUseError", "StreamUnavailableError", "TimeoutError",
    "AbortedError",
]

# --- element types and shapes ------------------------------------------------

_DTypeName = Literal[
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
    "uint64", "float16", "bfloat16", "float32", "float64",
]
# A name above (or a short alias: "f4", "u1", "bf16", ...), a NumPy dtype or
# scalar type, or an object with a `dtype`.
_DTypeLike = Union[_DTypeName, str, np.dtype[Any], type[Any]]
_Shape = Union[SupportsIndex, Sequence[SupportsIndex]]
_Count = Union[
    int,
    tuple[int],
    tuple[int, int],
    tuple[int, int, int],
    "Buffer",
]

class _ArrayInterfaceHolder(Protocol):
    @property
    def __array_interface__(self) -> dict[str, Any]: ...

class _CudaArrayInterfaceHolder(Protocol):
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]: ...

class _DLPackProducer(Protocol):
    # Producers differ in the keywords their __dlpack__ takes (stream,
    # max_version, dl_device, copy): only the device query is typed.
    def __dlpack_device__(self) -> Any: ...

class _Tobytes(Protocol):
    def tobytes(self) -> bytes: ...

class _TorchStream(Protocol):
    @property
    def cuda_stream(self) -> int: ...

class _CupyStream(Protocol):
    @property
    def ptr(self) -> int: ...

# A stream cubert does not own: an int numbered as the array API numbers
# CUDA streams (0 or 1: the legacy default stream, 2: the per-thread one,
# else a CUstream), or a PyTorch or CuPy stream object.
_NativeStream = Union[int, _TorchStream, _CupyStream]

# C-contiguous host data: bytes, bytearray, or anything with
# __array_interface__ (a NumPy array).
_HostData = Union[bytes, bytearray, _ArrayInterfaceHolder]
_WritableHost = Union[bytearray, _ArrayInterfaceHolder]
_Wrappable = Union[_ArrayInterfaceHolder, _CudaArrayInterfaceHolder]
# A launch argument: a Buffer binds a buffer parameter; a NumPy scalar (its
# exact bytes), anything with tobytes() giving 1, 2, 4 or 8 bytes, a float
# (32-bit float) or an int (32-bit signed) is a scalar.
_LaunchArg = Union["Buffer", np.generic, _Tobytes, float, int]

# --- dictionaries --------------------------------------------------------------

_Feature = Literal[
    "atomic_f32_add", "f64", "shared_memory", "cube_sync", "bounds_check",
    "dynamic_count", "graphs", "pinned_staging", "kernels", "host_memory",
    "collectives",
]

class _Properties(TypedDict):
    backend: str
    name: str
    architecture: str
    max_cube_dim: tuple[int, int, int]
    max_units_per_cube: int
    max_cube_count: tuple[int, int, int]
    max_shared_memory: int
    memory_total: int
    memory_alignment: int
    max_buffer_size: int
    compute_units: int
    features: set[_Feature]
    timing: Literal["host_clock", "device"]
    software_graphs: bool

class _MemoryUsage(TypedDict):
    buffers: int
    bytes_in_use: int
    bytes_padding: int
    bytes_reserved: int
    foreign_buffers: int
    foreign_bytes: int

class _MemoryStats(TypedDict):
    streams: int
    allocations: int
    releases: int
    pool_hits: int
    pool_misses: int
    device_allocations: int
    device_frees: int
    oom_events: int
    oom_retries: int
    buffers: int
    buffers_peak: int
    allocated_bytes: int
    allocated_bytes_peak: int
    reserved_bytes: int
    reserved_bytes_peak: int
    free_bytes: int
    free_bytes_peak: int

class _BufferInfo(TypedDict):
    handle: int  # the first handle's bits
    size: int
    stream: int
    pool: int | None  # position in the stream's memory report
    kind: Literal["sliced", "exclusive", "persistent", "expandable"] | None
    foreign: bool  # wrapped memory
    deferred: bool  # made in a dry run, not backed yet
    label: str

class _DeviceInfo(TypedDict):
    device: str
    index: int
    backend: str
    name: str
    architecture: str
    memory_total: int
    compute_units: int
    clients: int

# --- objects -------------------------------------------------------------------

@final
class Kernel:
    """A kernel in cube C (docs/kernels.md); not tied to a client."""

    def __init__(self, source: str, name: str,
                 cube_dim: _Shape = (1, 1, 1)) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def id(self) -> int: ...

@final
class Buffer:
    """Device memory owned by a client (a handle)."""

    @property
    def client(self) -> Client: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> _DTypeName: ...
    @property
    def native(self) -> tuple[int, int, bool]:
        """(address, size, host_accessible)."""
    @property
    def released(self) -> bool: ...
    @property
    def label(self) -> str:
        """The buffer's label ("" when none); at most 63 printable ASCII
        characters other than '"' and '\\'; None or "" clears it."""
    @label.setter
    def label(self, value: str | None) -> None: ...
    def numpy(self) -> np.ndarray[Any, np.dtype[Any]]: ...
    def read(self, out: _WritableHost, /) -> None: ...
    def write(self, obj: _HostData, /) -> None: ...
    def view(self, shape: _Shape, dtype: _DTypeLike | None = None) -> Buffer: ...
    def slice(self, offset: int, nbytes: int, /) -> Buffer: ...
    def mark_written(self) -> None: ...
    def release(self) -> None: ...
    def __dlpack__(self, *, stream: int | None = None,
                   max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None,
                   copy: bool | None = None) -> Any: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...

@final
class Graph(AbstractContextManager["Graph"]):
    """Launches recorded by Client.capture(), replayed on demand."""

    @property
    def id(self) -> int: ...
    def replay(self) -> None: ...
    def destroy(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, exc_type: type[BaseException] | None,
                 exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...

@final
class Profile(AbstractContextManager["Profile"]):
    """A profiling window; its results are set when the block ends."""

    @property
    def seconds(self) -> float: ...
    @property
    def method(self) -> Literal["host_clock", "device"]: ...
    @property
    def launches(self) -> int: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, exc_type: type[BaseException] | None,
                 exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...

@final
class Stream(AbstractContextManager["Stream"]):
    """A stream of a client (Client.stream); `with` makes the calling
    thread work on it within the block."""

    @property
    def id(self) -> int: ...
    @property
    def client(self) -> Client: ...
    @property
    def native(self) -> int:
        """The native queue: a CUstream on CUDA, 0 on host backends."""
    def synchronize(self) -> None: ...
    def wait_event(self, event: Event, /) -> None: ...
    def record_event(self, event: Event | None = None, /) -> Event: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, exc_type: type[BaseException] | None,
                 exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...

@final
class Event:
    """A point in a stream's work (Client.event)."""

    @property
    def client(self) -> Client: ...
    @property
    def timing(self) -> bool: ...
    @property
    def recorded(self) -> bool: ...
    def record(self, stream: Stream | _NativeStream | None = None, /) -> None: ...
    def wait(self, stream: Stream | _NativeStream | None = None, /) -> None: ...
    def synchronize(self) -> None: ...
    def query(self) -> bool: ...
    def elapsed_time(self, end: Event, /) -> float:
        """Milliseconds from this event to `end`."""

class Client:
    """A client of one device: "cpu", "cpu:N", "cuda", "cuda:N", "null",
    or None for $CUBERT_DEVICE, else the CPU."""

    def __init__(self, device: str | None = None, *, cpu_threads: int = 0,
                 cache_dir: str | None = None) -> None: ...
    @property
    def device(self) -> str: ...
    @property
    def backend(self) -> str: ...
    @property
    def closed(self) -> bool: ...
    @property
    def properties(self) -> _Properties: ...
    def close(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, exc_type: type[BaseException] | None,
                 exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...
    def empty(self, shape: _Shape, dtype: _DTypeLike = "uint8") -> Buffer: ...
    def asarray(self, obj: _HostData, dtype: _DTypeLike | None = None) -> Buffer: ...
    def wrap(self, obj: _Wrappable, /) -> Buffer: ...
    def from_dlpack(self, obj: _DLPackProducer, /) -> Buffer: ...
    def launch(self, kernel: Kernel, count: _Count, *args: _LaunchArg,
               checked: bool = False, skip: bool = False,
               validate: bool = False) -> None: ...
    def sync(self, *buffers: Buffer) -> None: ...
    def check(self, *buffers: Buffer) -> None: ...
    def flush(self) -> None: ...
    def capture(self) -> Graph: ...
    def graph_prepare(self) -> None: ...
    def profile(self) -> Profile: ...
    def dry_run(self) -> AbstractContextManager[Client]: ...
    def range(self, name: str) -> AbstractContextManager[Client]: ...
    def memory_usage(self, *, device: bool = False) -> _MemoryUsage: ...
    def memory_stats(self, *, device: bool = False) -> _MemoryStats: ...
    def memory_snapshot(self, *, device: bool = False) -> list[_BufferInfo]: ...
    def memory_report(self, format: Literal["table", "json"] = "table") -> str: ...
    def memory_cleanup(self) -> None: ...
    def reset_peaks(self) -> None: ...
    def stream_ids(self) -> list[int]: ...
    def stream(self, stream: Stream | int | None = None, /) -> Stream: ...
    def use_stream(self, stream: Stream | int, /) -> None: ...
    def event(self, *, timing: bool = True) -> Event: ...
    def native_stream(self) -> int: ...
    def native_wait(self, stream: _NativeStream, /) -> None: ...

# --- module functions ------------------------------------------------------------

def RawKernel(
    code: str | bytes,
    name: str,
    params: Sequence[tuple[Literal["in", "out", "inout", "scalar"],
                           _DTypeLike | int]],
    *,
    format: Literal["cuda", "cubin", "ptx", "c", "shared_object"],
    cube_dim: _Shape = (1, 1, 1),
    options: str | None = None,
) -> Kernel:
    """A kernel over backend source (CUDA C, C) or a binary (CUBIN, PTX, a
    shared object) with its parameters declared (docs/kernels.md)."""
    ...
def from_dlpack(obj: _DLPackProducer, client: Client | None = None) -> Buffer: ...
def default_client(device: str | None = None) -> Client: ...
def dry_run(client: Client) -> AbstractContextManager[Client]: ...
def backends() -> list[str]: ...
def devices(backend: str | None = None) -> list[_DeviceInfo]: ...

# --- errors ----------------------------------------------------------------------

class Error(Exception):
    """A cubert call failed."""

    code: int
    code_name: str
    message: str
    log: str | None
    causes: list[Error]
    def __init__(self, message: str, *, code: int | None = None,
                 code_name: str | None = None, log: str | None = None,
                 causes: Sequence[Error] = ()) -> None: ...

class InvalidArgumentError(Error, ValueError): ...
class NotFoundError(Error, LookupError): ...
class OutOfMemoryError(Error, MemoryError): ...
class BufferTooBigError(Error): ...
class PoolCapacityExceededError(Error): ...
class CompileError(Error): ...
class ResourceLimitError(Error): ...
class UnsupportedError(Error): ...
class GraphStateError(Error): ...
class DeviceFaultError(Error): ...
class SeveralError(Error): ...
class IoError(Error): ...
class UnavailableError(Error): ...
class InternalError(Error): ...
class StorageMappingFailedError(Error): ...
class ProfileError(Error): ...
class PoolsInUseError(Error): ...
class StreamUnavailableError(Error): ...
class TimeoutError(Error, builtins.TimeoutError): ...
class AbortedError(Error): ...
