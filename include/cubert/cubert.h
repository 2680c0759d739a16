/* cubert — the umbrella header. Include this one. */
#ifndef CUBERT_CUBERT_H
#define CUBERT_CUBERT_H

#include "cubert/export.h"
#include "cubert/version.h"
#include "cubert/error.h"
#include "cubert/log.h"
#include "cubert/client.h"
#include "cubert/device.h"
#include "cubert/comm.h"
#include "cubert/interop.h"
#include "cubert/dlpack.h"
#include "cubert/buffer.h"
#include "cubert/kernel.h"
#include "cubert/cpu_kernel.h"
#include "cubert/memory.h"
#include "cubert/profile.h"
#include "cubert/graph.h"

#endif /* CUBERT_CUBERT_H */
