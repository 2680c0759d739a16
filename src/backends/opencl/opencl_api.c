/* Loading the OpenCL ICD loader at run time (opencl_api.h). */
#include "backends/opencl/opencl_api.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "backends/common/library.h"
#include "cubert/backend/errors.h"

static opencl_api api;
static library_once loading = LIBRARY_ONCE_INIT;

/* Every entry point the backend calls: the loader exports each under its
 * own name. */
static const library_symbol symbols[] = {
#define FN(name) LIBRARY_SYMBOL(api.name, #name)
    FN(clGetPlatformIDs),
    FN(clGetPlatformInfo),
    FN(clGetDeviceIDs),
    FN(clGetDeviceInfo),
    FN(clCreateContext),
    FN(clReleaseContext),
    FN(clCreateCommandQueue),
    FN(clReleaseCommandQueue),
    FN(clCreateBuffer),
    FN(clReleaseMemObject),
    FN(clEnqueueReadBuffer),
    FN(clEnqueueWriteBuffer),
    FN(clEnqueueFillBuffer),
    FN(clEnqueueMarkerWithWaitList),
    FN(clCreateProgramWithSource),
    FN(clCreateProgramWithBinary),
    FN(clBuildProgram),
    FN(clGetProgramInfo),
    FN(clGetProgramBuildInfo),
    FN(clReleaseProgram),
    FN(clCreateKernel),
    FN(clReleaseKernel),
    FN(clSetKernelArg),
    FN(clEnqueueNDRangeKernel),
    FN(clFlush),
    FN(clFinish),
    FN(clWaitForEvents),
    FN(clGetEventInfo),
    FN(clGetEventProfilingInfo),
    FN(clReleaseEvent),
#undef FN
};

static void load(void)
{
    static const char *const names[] = {"libOpenCL.so.1", "libOpenCL.so", NULL};
    library_load("opencl_library", names, RTLD_NOW | RTLD_LOCAL, symbols,
                 sizeof symbols / sizeof symbols[0], "entry point",
                 "OpenCL 1.2 or newer is needed", api.loader_path,
                 sizeof api.loader_path, loading.failure,
                 sizeof loading.failure);
}

cube_error *opencl_api_load(const opencl_api **out)
{
    *out = NULL;
    const char *failure = library_once_run(&loading, load);
    if (failure)
        return cube_error_new(CUBE_ERR_UNAVAILABLE,
                              "no OpenCL ICD loader (tried %s): install "
                              "ocl-icd-libopencl1 and a driver, such as "
                              "pocl-opencl-icd, or set CUBERT_OPENCL_LIBRARY",
                              failure);
    *out = &api;
    return NULL;
}

const char *opencl_error_name(cl_int code)
{
    switch (code) {
    case CL_SUCCESS: return "CL_SUCCESS";
    case CL_DEVICE_NOT_FOUND: return "CL_DEVICE_NOT_FOUND";
    case CL_DEVICE_NOT_AVAILABLE: return "CL_DEVICE_NOT_AVAILABLE";
    case CL_COMPILER_NOT_AVAILABLE: return "CL_COMPILER_NOT_AVAILABLE";
    case CL_MEM_OBJECT_ALLOCATION_FAILURE:
        return "CL_MEM_OBJECT_ALLOCATION_FAILURE";
    case CL_OUT_OF_RESOURCES: return "CL_OUT_OF_RESOURCES";
    case CL_OUT_OF_HOST_MEMORY: return "CL_OUT_OF_HOST_MEMORY";
    case CL_BUILD_PROGRAM_FAILURE: return "CL_BUILD_PROGRAM_FAILURE";
    case CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST:
        return "CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST";
    case CL_INVALID_VALUE: return "CL_INVALID_VALUE";
    case CL_INVALID_BINARY: return "CL_INVALID_BINARY";
    case CL_INVALID_KERNEL_NAME: return "CL_INVALID_KERNEL_NAME";
    case CL_INVALID_WORK_GROUP_SIZE: return "CL_INVALID_WORK_GROUP_SIZE";
    case CL_INVALID_BUFFER_SIZE: return "CL_INVALID_BUFFER_SIZE";
    case CL_PLATFORM_NOT_FOUND_KHR: return "CL_PLATFORM_NOT_FOUND_KHR";
    default: return "an OpenCL error";
    }
}
