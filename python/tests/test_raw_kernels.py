"""Raw kernels from Python: C source on the CPU backend (CUDA source and
binaries run in test_gpu_interop.py's environment through the C suite),
declared parameters, errors."""

import numpy as np
import pytest

import cubert

SAXPY = r"""
void saxpy(const cube_cpu_cube *c)
{
    const float *x = c->params[0].data;
    float *y = c->params[1].data;
    float a = *(const float *)c->params[2].data;
    uint64_t n = c->params[1].bytes / sizeof(float);
    for (uint32_t u = 0; u < c->dim[0]; u++) {
        uint64_t i = (uint64_t)c->index * c->dim[0] + u;
        if (i < n)
            y[i] = a * x[i] + y[i];
    }
}
"""
PARAMS = [("in", "float32"), ("inout", "float32"), ("scalar", "float32")]


def test_c_source_kernel_runs_over_many_cubes(client):
    k = cubert.RawKernel(SAXPY, "saxpy", PARAMS, format="c", cube_dim=64)
    assert isinstance(k, cubert.Kernel) and k.name == "saxpy"
    n = 10_000
    x = client.asarray(np.arange(n, dtype=np.float32))
    y = client.asarray(np.ones(n, np.float32))
    client.launch(k, (n + 63) // 64, x, y, np.float32(3.0))
    np.testing.assert_array_equal(y.numpy(), 3 * np.arange(n) + 1)


def test_declared_output_carries_a_failed_launch(client):
    broken = cubert.RawKernel("void saxpy(const cube_cpu_cube *c) { nope; }",
                              "saxpy", PARAMS, format="c")
    x = client.asarray(np.zeros(4, np.float32))
    y = client.asarray(np.zeros(4, np.float32))
    with pytest.raises(cubert.CompileError) as e:
        client.launch(broken, 1, x, y, 1.0)
    assert e.value.log and "nope" in e.value.log
    with pytest.raises(cubert.SeveralError):
        y.numpy()          # the declared inout carries the failure
    x.numpy()              # the input does not


def test_arguments_are_checked_against_the_declaration(client):
    k = cubert.RawKernel(SAXPY, "saxpy", PARAMS, format="c")
    x = client.asarray(np.zeros(4, np.float32))
    y = client.asarray(np.zeros(4, np.float32))
    with pytest.raises(cubert.InvalidArgumentError):
        client.launch(k, 1, x, y)                      # one missing
    with pytest.raises(cubert.InvalidArgumentError):
        client.launch(k, 1, x, y, np.float64(1.0))     # 8 bytes, not 4


def test_hostile_declarations_are_refused():
    with pytest.raises(TypeError):
        cubert.RawKernel(SAXPY, "saxpy", PARAMS)            # no format
    with pytest.raises(cubert.InvalidArgumentError):
        cubert.RawKernel(SAXPY, "saxpy", PARAMS, format="fortran")
    with pytest.raises(cubert.InvalidArgumentError):
        cubert.RawKernel(SAXPY, "saxpy", [("sideways", "float32")],
                         format="c")
    with pytest.raises(TypeError):
        cubert.RawKernel(SAXPY, "saxpy", ["in"], format="c")
    with pytest.raises(cubert.InvalidArgumentError):
        cubert.RawKernel(SAXPY, "saxpy", [("scalar", 3)], format="c")
    with pytest.raises(cubert.InvalidArgumentError):
        cubert.RawKernel(SAXPY, "not an identifier", PARAMS, format="c")
    with pytest.raises(cubert.InvalidArgumentError):
        cubert.RawKernel(SAXPY, "saxpy", [("in", 4)] * 25, format="c")
    with pytest.raises(TypeError):
        cubert.RawKernel(b"\x7fELF", "saxpy", PARAMS, format="c")


def test_a_cuda_kernel_on_the_cpu_is_unsupported(client):
    k = cubert.RawKernel('extern "C" __global__ void f(float *y) {}', "f",
                         [("out", "float32")], format="cuda")
    y = client.asarray(np.zeros(4, np.float32))
    with pytest.raises(cubert.UnsupportedError):
        client.launch(k, 1, y)
