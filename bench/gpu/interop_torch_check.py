#!/usr/bin/env python3
"""PyTorch memory used by cubert with nothing copied, through the C API
(cubert/interop.h) from ctypes.

  1. A torch tensor's memory is wrapped as a cubert buffer
     (cube_wrap_memory, with a release callback); a cube C kernel writes it;
     cube_sync; torch reads the result in the same tensor.
  2. The other way: a cubert buffer's native address is read by torch
     right after a cubert kernel wrote it, on cubert's own stream
     (cube_native_stream wrapped as a torch.cuda.ExternalStream).
  3. torch writes a wrapped tensor on cubert's stream, cube_native_written
     says so, and a cubert read sees the bytes.
  4. The release callback runs once, when the last reference goes.
  5. cube_dlpack_export hands a buffer to torch.from_dlpack (a versioned
     capsule), ready on torch's current stream.
  6. cube_dlpack_import takes a torch tensor's __dlpack__ capsule.

  python3 bench/gpu/interop_torch_check.py LIBCUBERT_SO

Prints one line per check and exits 0 when all pass, 1 on a failure, 77
when torch or a GPU is missing.
"""

import ctypes as C
import sys


class Handle(C.Structure):
    _fields_ = [("bits", C.c_uint64)]


class KernelDesc(C.Structure):
    _fields_ = [("name", C.c_char_p), ("source", C.c_char_p),
                ("cube_dim", C.c_uint32 * 3)]


class Count(C.Structure):
    _fields_ = [("x", C.c_uint32), ("y", C.c_uint32), ("z", C.c_uint32),
                ("dynamic", Handle)]


class ArgValue(C.Union):
    _fields_ = [("buffer", Handle), ("bytes", C.c_ubyte * 8),
                ("align_", C.c_uint64)]


class Arg(C.Structure):
    _fields_ = [("kind", C.c_int), ("size", C.c_uint32), ("value", ArgValue)]


class Native(C.Structure):
    _fields_ = [("address", C.c_uint64), ("size", C.c_uint64),
                ("host_accessible", C.c_int)]


RELEASE = C.CFUNCTYPE(None, C.c_void_p)

FILL = b"""
CUBE_KERNEL(fill, CUBE_OUT(float, y), CUBE_SCALAR(float, v))
{
    uint32_t i = ABSOLUTE_POS_X;
    if (i < CUBE_LEN(y))
        y[i] = v + (float)i;
}
"""


def main():
    try:
        import torch
    except ImportError:
        print("interop_torch_check: no torch")
        return 77
    if not torch.cuda.is_available() or len(sys.argv) < 2:
        print("interop_torch_check: no GPU (or no library path)")
        return 77
    lib = C.CDLL(sys.argv[1])
    lib.cube_error_message.restype = C.c_char_p
    lib.cube_error_message.argtypes = [C.c_void_p]
    lib.cube_error_free.argtypes = [C.c_void_p]
    for name in ("cube_client_open", "cube_kernel_create", "cube_launch",
                 "cube_sync", "cube_wrap_memory", "cube_native_buffer_get",
                 "cube_native_stream", "cube_native_written",
                 "cube_handle_release", "cube_empty", "cube_read"):
        getattr(lib, name).restype = C.c_void_p

    def ok(err, what):
        if err:
            msg = lib.cube_error_message(err).decode()
            lib.cube_error_free(err)
            raise RuntimeError(f"{what}: {msg}")

    torch.cuda.init()
    client = C.c_void_p()
    ok(lib.cube_client_open(b"cuda:0", None, C.byref(client)), "open")
    kernel = C.c_void_p()
    desc = KernelDesc(b"fill", FILL, (C.c_uint32 * 3)(256, 1, 1))
    ok(lib.cube_kernel_create(C.byref(desc), C.byref(kernel)), "kernel")
    lib.cube_launch.argtypes = [C.c_void_p, C.c_void_p, Count,
                                C.POINTER(Arg), C.c_size_t, C.c_uint32]

    def fill(handle, n, v):
        args = (Arg * 2)()
        args[0].kind = 1
        args[0].value.buffer = handle
        args[1].kind = 2
        args[1].size = 4
        C.memmove(args[1].value.bytes, C.byref(C.c_float(v)), 4)
        count = Count((n + 255) // 256, 1, 1, Handle(0))
        ok(lib.cube_launch(client, kernel, count, args, 2, 0), "launch")

    failures = 0
    n = 1 << 20
    releases = []
    keep = {}

    def on_release(user):
        releases.append(user)
        keep.pop(user, None)  # the tensor may go now

    release_fn = RELEASE(on_release)

    # 1. torch's memory, written by a cubert kernel, read by torch.
    t = torch.zeros(n, dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    keep[1] = t
    h = Handle()
    lib.cube_wrap_memory.argtypes = [C.c_void_p, C.c_uint64, C.c_uint64,
                                     RELEASE, C.c_void_p, C.POINTER(Handle)]
    ok(lib.cube_wrap_memory(client, t.data_ptr(), n * 4, release_fn,
                            C.c_void_p(1), C.byref(h)), "wrap")
    fill(h, n, 3.0)
    lib.cube_sync.argtypes = [C.c_void_p, C.POINTER(Handle), C.c_size_t]
    ok(lib.cube_sync(client, C.byref(h), 1), "sync")
    want = 3.0 + torch.arange(n, device="cuda", dtype=torch.float32)
    good = torch.equal(t, want)
    print(f"torch memory written by a cubert kernel, no copy: "
          f"{'ok' if good else 'WRONG'}")
    failures += not good

    # 2. cubert's memory read by torch on cubert's stream, at once.
    b = Handle()
    lib.cube_empty.argtypes = [C.c_void_p, C.c_uint64, C.POINTER(Handle)]
    ok(lib.cube_empty(client, n * 4, C.byref(b)), "empty")
    fill(b, n, 7.0)
    native = Native()
    lib.cube_native_buffer_get.argtypes = [C.c_void_p, Handle,
                                           C.POINTER(Native)]
    ok(lib.cube_native_buffer_get(client, b, C.byref(native)), "native")
    stream = C.c_void_p()
    ok(lib.cube_native_stream(client, C.byref(stream)), "stream")
    ext = torch.cuda.ExternalStream(stream.value)
    # A torch view of cubert's memory, through a wrapper torch accepts.
    class View:
        __cuda_array_interface__ = {
            "shape": (n,), "typestr": "<f4", "version": 3,
            "data": (native.address, False), "stream": None}
    with torch.cuda.stream(ext):
        v = torch.as_tensor(View(), device="cuda")
        s = v.sum()
    torch.cuda.synchronize()
    want_sum = float(n) * 7.0 + float(n) * (n - 1) / 2.0
    good = abs(s.item() - want_sum) / want_sum < 1e-5
    print(f"cubert memory read by torch on cubert's stream: "
          f"{'ok' if good else 'WRONG'} ({s.item():.6g} vs {want_sum:.6g})")
    failures += not good

    # 3. torch writes wrapped memory on cubert's stream; cubert reads it.
    with torch.cuda.stream(ext):
        t.fill_(42.0)
    lib.cube_native_written.argtypes = [C.c_void_p, Handle]
    ok(lib.cube_native_written(client, h), "written")
    out = (C.c_float * 4)()

    class Desc(C.Structure):
        _fields_ = [("handle", Handle), ("rank", C.c_uint32),
                    ("shape", C.c_uint64 * 8), ("strides", C.c_uint64 * 8),
                    ("elem_size", C.c_uint32)]

    d = Desc()
    d.handle = h
    d.rank = 1
    d.shape[0] = 16
    d.elem_size = 1
    dst = (C.c_void_p * 1)(C.cast(out, C.c_void_p))
    size = (C.c_uint64 * 1)(16)
    lib.cube_read.argtypes = [C.c_void_p, C.POINTER(Desc),
                              C.POINTER(C.c_void_p), C.POINTER(C.c_uint64),
                              C.c_size_t]
    ok(lib.cube_read(client, C.byref(d), dst, size, 1), "read")
    good = list(out) == [42.0] * 4
    print(f"torch's write on cubert's stream seen by a cubert read: "
          f"{'ok' if good else 'WRONG'} {list(out)}")
    failures += not good

    # 5. DLPack out: a cubert buffer as a torch tensor (a versioned
    # capsule), made ready on torch's current stream.
    api = C.pythonapi
    api.PyCapsule_New.restype = C.py_object
    api.PyCapsule_New.argtypes = [C.c_void_p, C.c_char_p, C.c_void_p]
    api.PyCapsule_GetPointer.restype = C.c_void_p
    api.PyCapsule_GetPointer.argtypes = [C.py_object, C.c_char_p]
    api.PyCapsule_SetName.argtypes = [C.py_object, C.c_char_p]

    class DType(C.Structure):
        _fields_ = [("code", C.c_uint8), ("bits", C.c_uint8),
                    ("lanes", C.c_uint16)]

    e = Handle()
    ok(lib.cube_empty(client, n * 4, C.byref(e)), "empty")
    fill(e, n, 5.0)
    lib.cube_dlpack_export.restype = C.c_void_p
    lib.cube_dlpack_export.argtypes = [
        C.c_void_p, Handle, DType, C.c_int32, C.POINTER(C.c_int64),
        C.POINTER(C.c_int64), C.c_void_p, C.POINTER(C.c_void_p)]
    managed = C.c_void_p()
    shape = (C.c_int64 * 1)(n)
    consumer = torch.cuda.current_stream().cuda_stream
    ok(lib.cube_dlpack_export(client, e, DType(2, 32, 1), 1, shape, None,
                              C.c_void_p(consumer), C.byref(managed)),
       "export")
    capsule = api.PyCapsule_New(managed, b"dltensor_versioned", None)
    x = torch.from_dlpack(capsule)
    want = 5.0 + torch.arange(n, device="cuda", dtype=torch.float32)
    good = torch.equal(x, want) and x.data_ptr() != 0
    print(f"DLPack export read by torch.from_dlpack: "
          f"{'ok' if good else 'WRONG'}")
    failures += not good
    del x, capsule
    ok(lib.cube_handle_release(client, e), "release")

    # 6. DLPack in: a torch tensor taken in by cubert, nothing copied.
    y = torch.arange(64, device="cuda", dtype=torch.float32) * 2.0
    torch.cuda.synchronize()
    cap = y.__dlpack__(max_version=(1, 0))
    ptr = api.PyCapsule_GetPointer(cap, b"dltensor_versioned")
    imported = Handle()
    lib.cube_dlpack_import.restype = C.c_void_p
    lib.cube_dlpack_import.argtypes = [C.c_void_p, C.c_void_p,
                                       C.POINTER(Handle)]
    ok(lib.cube_dlpack_import(client, C.c_void_p(ptr), C.byref(imported)),
       "import")
    api.PyCapsule_SetName(cap, b"used_dltensor_versioned")
    d.handle = imported
    ok(lib.cube_read(client, C.byref(d), dst, size, 1), "read")
    good = list(out) == [0.0, 2.0, 4.0, 6.0]
    print(f"torch tensor taken in by cube_dlpack_import: "
          f"{'ok' if good else 'WRONG'} {list(out)}")
    failures += not good
    ok(lib.cube_handle_release(client, imported), "release")

    # 4. the release callback, once.
    lib.cube_handle_release.argtypes = [C.c_void_p, Handle]
    ok(lib.cube_handle_release(client, h), "release")
    ok(lib.cube_handle_release(client, b), "release")
    good = releases == [1]
    print(f"release callback called once: {'ok' if good else 'WRONG'} "
          f"{releases}")
    failures += not good
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
