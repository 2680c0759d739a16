/* Loading the OpenCL ICD loader at run time (opencl_api.h). */
#include "backends/opencl/opencl_api.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "backends/common/library.h"
#include "cubert/backend/errors.h"

static opencl_api api;
static char load_failure[768]; /* empty: loaded */
static pthread_once_t load_once = PTHREAD_ONCE_INIT;

/* Every entry point the backend calls, by its field in opencl_api: the
 * loader exports each under its own name. */
#define OPENCL_SYMBOLS(X)                                                      \
    X(clGetPlatformIDs)                                                        \
    X(clGetPlatformInfo)                                                       \
    X(clGetDeviceIDs)                                                          \
    X(clGetDeviceInfo)                                                         \
    X(clCreateContext)                                                         \
    X(clReleaseContext)                                                        \
    X(clCreateCommandQueue)                                                    \
    X(clReleaseCommandQueue)                                                   \
    X(clCreateBuffer)                                                          \
    X(clReleaseMemObject)                                                      \
    X(clEnqueueReadBuffer)                                                     \
    X(clEnqueueWriteBuffer)                                                    \
    X(clEnqueueFillBuffer)                                                     \
    X(clEnqueueMarkerWithWaitList)                                             \
    X(clCreateProgramWithSource)                                               \
    X(clCreateProgramWithBinary)                                               \
    X(clBuildProgram)                                                          \
    X(clGetProgramInfo)                                                        \
    X(clGetProgramBuildInfo)                                                   \
    X(clReleaseProgram)                                                        \
    X(clCreateKernel)                                                          \
    X(clReleaseKernel)                                                         \
    X(clSetKernelArg)                                                          \
    X(clEnqueueNDRangeKernel)                                                  \
    X(clFlush)                                                                 \
    X(clFinish)                                                                \
    X(clWaitForEvents)                                                         \
    X(clGetEventInfo)                                                          \
    X(clGetEventProfilingInfo)                                                 \
    X(clReleaseEvent)

static void load(void)
{
    static const char *const names[] = {"libOpenCL.so.1", "libOpenCL.so",
                                        NULL};
    char tried[512] = "";
    void *lib = library_open("opencl_library", names, RTLD_NOW | RTLD_LOCAL,
                             api.loader_path, sizeof api.loader_path, tried,
                             sizeof tried);
    if (!lib) {
        snprintf(load_failure, sizeof load_failure,
                 "no OpenCL ICD loader: %s (install ocl-icd-libopencl1 and "
                 "a driver, such as pocl-opencl-icd)",
                 tried);
        return;
    }
#define OPENCL_RESOLVE(name)                                                   \
    *(void **)&api.name = dlsym(lib, #name);                                   \
    if (!api.name) {                                                           \
        snprintf(load_failure, sizeof load_failure,                            \
                 "the OpenCL loader %s has no entry point " #name              \
                 " (OpenCL 1.2 or newer is needed)",                           \
                 api.loader_path);                                             \
        return;                                                                \
    }
    OPENCL_SYMBOLS(OPENCL_RESOLVE)
#undef OPENCL_RESOLVE
}

cube_error *opencl_api_load(const opencl_api **out)
{
    pthread_once(&load_once, load);
    if (load_failure[0]) {
        *out = NULL;
        return cube_error_new(CUBE_ERR_UNAVAILABLE, "%s", load_failure);
    }
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
