/* The OpenCL API through the ICD loader (libOpenCL.so.1), loaded with
 * dlopen at run time.
 *
 * cubert is built without OpenCL headers or libraries: this file declares
 * the few types, constants and entry points the backend uses, with the
 * values of the Khronos headers (OpenCL 1.2, which every ICD loader and
 * driver still exports, plus two 3.0 queries). One binary then runs with
 * or without an OpenCL driver, and without one `opencl_api_load` says
 * why.
 *
 * Thread safety: opencl_api_load may be called from any thread; the table
 * it returns never changes and is never freed (the loader stays loaded
 * for the life of the process, as ICDs expect). OpenCL's own calls are
 * thread-safe, except clSetKernelArg on one kernel object (the backend
 * serializes the launches of a kernel).
 */
#ifndef CUBE_OPENCL_API_H
#define CUBE_OPENCL_API_H

#include <stddef.h>
#include <stdint.h>

#include "cubert/error.h"

typedef int32_t cl_int;
typedef uint32_t cl_uint;
typedef uint64_t cl_ulong;
typedef cl_uint cl_bool;
typedef cl_ulong cl_bitfield;
typedef cl_bitfield cl_device_type;
typedef cl_bitfield cl_mem_flags;
typedef cl_bitfield cl_map_flags;
typedef cl_bitfield cl_command_queue_properties;
typedef cl_uint cl_platform_info;
typedef cl_uint cl_device_info;
typedef cl_uint cl_program_info;
typedef cl_uint cl_program_build_info;
typedef cl_uint cl_event_info;
typedef cl_uint cl_profiling_info;
typedef intptr_t cl_context_properties;
typedef struct _cl_platform_id *cl_platform_id;
typedef struct _cl_device_id *cl_device_id;
typedef struct _cl_context *cl_context;
typedef struct _cl_command_queue *cl_command_queue;
typedef struct _cl_mem *cl_mem;
typedef struct _cl_program *cl_program;
typedef struct _cl_kernel *cl_kernel;
typedef struct _cl_event *cl_event;

enum {
    CL_SUCCESS = 0,
    CL_DEVICE_NOT_FOUND = -1,
    CL_DEVICE_NOT_AVAILABLE = -2,
    CL_COMPILER_NOT_AVAILABLE = -3,
    CL_MEM_OBJECT_ALLOCATION_FAILURE = -4,
    CL_OUT_OF_RESOURCES = -5,
    CL_OUT_OF_HOST_MEMORY = -6,
    CL_BUILD_PROGRAM_FAILURE = -11,
    CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST = -14,
    CL_INVALID_VALUE = -30,
    CL_INVALID_BINARY = -42,
    CL_INVALID_KERNEL_NAME = -46,
    CL_INVALID_WORK_GROUP_SIZE = -54,
    CL_INVALID_BUFFER_SIZE = -61,
    CL_PLATFORM_NOT_FOUND_KHR = -1001
};

#define CL_TRUE 1u
#define CL_FALSE 0u

/* Platform and device queries. */
enum {
    CL_PLATFORM_VERSION = 0x0901,
    CL_PLATFORM_NAME = 0x0902,
    CL_PLATFORM_VENDOR = 0x0903,
    CL_DEVICE_TYPE = 0x1000,
    CL_DEVICE_MAX_COMPUTE_UNITS = 0x1002,
    CL_DEVICE_MAX_WORK_GROUP_SIZE = 0x1004,
    CL_DEVICE_MAX_WORK_ITEM_SIZES = 0x1005,
    CL_DEVICE_MAX_MEM_ALLOC_SIZE = 0x1010,
    CL_DEVICE_MEM_BASE_ADDR_ALIGN = 0x1019, /* bits */
    CL_DEVICE_GLOBAL_MEM_SIZE = 0x101F,
    CL_DEVICE_LOCAL_MEM_SIZE = 0x1023,
    CL_DEVICE_NAME = 0x102B,
    CL_DEVICE_VENDOR = 0x102C,
    CL_DRIVER_VERSION = 0x102D,
    CL_DEVICE_VERSION = 0x102F,
    CL_DEVICE_EXTENSIONS = 0x1030,
    CL_DEVICE_OPENCL_C_VERSION = 0x103D,
    CL_DEVICE_GENERIC_ADDRESS_SPACE_SUPPORT = 0x1069 /* OpenCL 3.0 */
};

#define CL_DEVICE_TYPE_CPU (1ull << 1)
#define CL_DEVICE_TYPE_GPU (1ull << 2)
#define CL_DEVICE_TYPE_ALL 0xFFFFFFFFull

#define CL_CONTEXT_PLATFORM 0x1084
#define CL_QUEUE_PROFILING_ENABLE (1ull << 1)
#define CL_MEM_READ_WRITE (1ull << 0)
#define CL_MEM_ALLOC_HOST_PTR (1ull << 4)
#define CL_MEM_COPY_HOST_PTR (1ull << 5)
#define CL_MAP_READ (1ull << 0)
#define CL_MAP_WRITE (1ull << 1)

enum {
    CL_PROGRAM_BINARY_SIZES = 0x1165,
    CL_PROGRAM_BINARIES = 0x1166,
    CL_PROGRAM_BUILD_LOG = 0x1183,
    CL_EVENT_COMMAND_EXECUTION_STATUS = 0x11D3,
    CL_PROFILING_COMMAND_END = 0x1283
};

#define CL_API_CALL

/* The entry points, as the loader exports them. */
typedef struct opencl_api {
    cl_int(CL_API_CALL *clGetPlatformIDs)(cl_uint, cl_platform_id *, cl_uint *);
    cl_int(CL_API_CALL *clGetPlatformInfo)(cl_platform_id, cl_platform_info,
                                           size_t, void *, size_t *);
    cl_int(CL_API_CALL *clGetDeviceIDs)(cl_platform_id, cl_device_type, cl_uint,
                                        cl_device_id *, cl_uint *);
    cl_int(CL_API_CALL *clGetDeviceInfo)(cl_device_id, cl_device_info, size_t,
                                         void *, size_t *);
    cl_context(CL_API_CALL *clCreateContext)(
        const cl_context_properties *, cl_uint, const cl_device_id *,
        void(CL_API_CALL *)(const char *, const void *, size_t, void *), void *,
        cl_int *);
    cl_int(CL_API_CALL *clReleaseContext)(cl_context);
    cl_command_queue(CL_API_CALL *clCreateCommandQueue)(
        cl_context, cl_device_id, cl_command_queue_properties, cl_int *);
    cl_int(CL_API_CALL *clReleaseCommandQueue)(cl_command_queue);
    cl_mem(CL_API_CALL *clCreateBuffer)(cl_context, cl_mem_flags, size_t,
                                        void *, cl_int *);
    cl_int(CL_API_CALL *clReleaseMemObject)(cl_mem);
    cl_int(CL_API_CALL *clEnqueueReadBuffer)(cl_command_queue, cl_mem, cl_bool,
                                             size_t, size_t, void *, cl_uint,
                                             const cl_event *, cl_event *);
    cl_int(CL_API_CALL *clEnqueueWriteBuffer)(cl_command_queue, cl_mem, cl_bool,
                                              size_t, size_t, const void *,
                                              cl_uint, const cl_event *,
                                              cl_event *);
    cl_int(CL_API_CALL *clEnqueueFillBuffer)(cl_command_queue, cl_mem,
                                             const void *, size_t, size_t,
                                             size_t, cl_uint, const cl_event *,
                                             cl_event *);
    cl_int(CL_API_CALL *clEnqueueMarkerWithWaitList)(cl_command_queue, cl_uint,
                                                     const cl_event *,
                                                     cl_event *);
    cl_program(CL_API_CALL *clCreateProgramWithSource)(cl_context, cl_uint,
                                                       const char **,
                                                       const size_t *,
                                                       cl_int *);
    cl_program(CL_API_CALL *clCreateProgramWithBinary)(cl_context, cl_uint,
                                                       const cl_device_id *,
                                                       const size_t *,
                                                       const unsigned char **,
                                                       cl_int *, cl_int *);
    cl_int(CL_API_CALL *clBuildProgram)(cl_program, cl_uint,
                                        const cl_device_id *, const char *,
                                        void(CL_API_CALL *)(cl_program, void *),
                                        void *);
    cl_int(CL_API_CALL *clGetProgramInfo)(cl_program, cl_program_info, size_t,
                                          void *, size_t *);
    cl_int(CL_API_CALL *clGetProgramBuildInfo)(cl_program, cl_device_id,
                                               cl_program_build_info, size_t,
                                               void *, size_t *);
    cl_int(CL_API_CALL *clReleaseProgram)(cl_program);
    cl_kernel(CL_API_CALL *clCreateKernel)(cl_program, const char *, cl_int *);
    cl_int(CL_API_CALL *clReleaseKernel)(cl_kernel);
    cl_int(CL_API_CALL *clSetKernelArg)(cl_kernel, cl_uint, size_t,
                                        const void *);
    cl_int(CL_API_CALL *clEnqueueNDRangeKernel)(cl_command_queue, cl_kernel,
                                                cl_uint, const size_t *,
                                                const size_t *, const size_t *,
                                                cl_uint, const cl_event *,
                                                cl_event *);
    cl_int(CL_API_CALL *clFlush)(cl_command_queue);
    cl_int(CL_API_CALL *clFinish)(cl_command_queue);
    cl_int(CL_API_CALL *clWaitForEvents)(cl_uint, const cl_event *);
    cl_int(CL_API_CALL *clGetEventInfo)(cl_event, cl_event_info, size_t, void *,
                                        size_t *);
    cl_int(CL_API_CALL *clGetEventProfilingInfo)(cl_event, cl_profiling_info,
                                                 size_t, void *, size_t *);
    cl_int(CL_API_CALL *clReleaseEvent)(cl_event);
    char loader_path[256];
} opencl_api;

/* Loads the ICD loader (the `opencl_library` key, else libOpenCL.so.1,
 * else libOpenCL.so) once. *out is the table, or NULL with the reason in
 * the returned CUBE_ERR_UNAVAILABLE. */
cube_error *opencl_api_load(const opencl_api **out);

/* The name of an OpenCL error code ("CL_OUT_OF_RESOURCES"), or "an
 * OpenCL error" for a code it does not know. Static. */
const char *opencl_error_name(cl_int code);

#endif /* CUBE_OPENCL_API_H */
