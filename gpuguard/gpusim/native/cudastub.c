/* gpusim's stand-in for libcuda.so.1: the CUDA driver API's entry points a launch probe
 * watches, with their real signatures. Each one calls the hook its process registered
 * (gpusim's client does the simulated work there) and returns what the hook returns, so a
 * launch returns once queued and a synchronize returns once the simulated work is done.
 * Without a hook every entry point returns CUDA_SUCCESS (0) at once. */
#include <stddef.h>

typedef int CUresult;
typedef void *CUfunction;
typedef void *CUstream;
typedef void *CUevent;
typedef void *CUgraphExec;
typedef unsigned long long CUdeviceptr;
typedef struct CUlaunchConfig_st CUlaunchConfig;

/* what the hook is told; gpusim's driver.py mirrors these numbers */
enum { GS_LAUNCH = 1, GS_COPY = 2, GS_WAIT = 3, GS_QUERY = 4, GS_COPY_OUT = 5 };

typedef int (*gpusim_hook_fn)(int kind);
static gpusim_hook_fn hook;

/* Marks this file as gpusim's stand-in: a real driver has no such symbol. */
const char gpusim_driver_stub[] = "gpusim";

void gpusim_set_hook(gpusim_hook_fn fn) { hook = fn; }

static CUresult call(int kind) { return hook ? hook(kind) : 0; }

#define LAUNCH_ARGS                                                                          \
    CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,           \
        unsigned bz, unsigned shared, CUstream stream, void **params
CUresult cuLaunchKernel(LAUNCH_ARGS, void **extra) { return call(GS_LAUNCH); }
CUresult cuLaunchKernel_ptsz(LAUNCH_ARGS, void **extra) { return call(GS_LAUNCH); }
CUresult cuLaunchCooperativeKernel(LAUNCH_ARGS) { return call(GS_LAUNCH); }
CUresult cuLaunchCooperativeKernel_ptsz(LAUNCH_ARGS) { return call(GS_LAUNCH); }
CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **p, void **e) {
    return call(GS_LAUNCH);
}
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **p, void **e) {
    return call(GS_LAUNCH);
}
CUresult cuGraphLaunch(CUgraphExec g, CUstream s) { return call(GS_LAUNCH); }
CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) { return call(GS_LAUNCH); }

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *h, size_t n, CUstream s) {
    return call(GS_COPY);
}
CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr d, const void *h, size_t n, CUstream s) {
    return call(GS_COPY);
}
CUresult cuMemcpyDtoHAsync_v2(void *h, CUdeviceptr d, size_t n, CUstream s) {
    return call(GS_COPY_OUT);
}
CUresult cuMemcpyDtoHAsync_v2_ptsz(void *h, CUdeviceptr d, size_t n, CUstream s) {
    return call(GS_COPY_OUT);
}
CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s_, size_t n, CUstream s) {
    return call(GS_COPY);
}
CUresult cuMemcpyAsync_ptsz(CUdeviceptr d, CUdeviceptr s_, size_t n, CUstream s) {
    return call(GS_COPY);
}

CUresult cuStreamSynchronize(CUstream s) { return call(GS_WAIT); }
CUresult cuStreamSynchronize_ptsz(CUstream s) { return call(GS_WAIT); }
CUresult cuEventSynchronize(CUevent e) { return call(GS_WAIT); }
CUresult cuCtxSynchronize(void) { return call(GS_WAIT); }
CUresult cuStreamQuery(CUstream s) { return call(GS_QUERY); }
CUresult cuStreamQuery_ptsz(CUstream s) { return call(GS_QUERY); }
CUresult cuEventQuery(CUevent e) { return call(GS_QUERY); }

/* A launch-bound loop for the benchmark: n launches, each after `spin_ns` of host work. */
#include <time.h>
static unsigned long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}
/* through a pointer: the loop must enter cuLaunchKernel's code, as a program's call does */
static CUresult (*volatile launch_kernel)(LAUNCH_ARGS, void **extra) = cuLaunchKernel;
unsigned long long gpusim_launch_loop(unsigned long long n, unsigned long long spin_ns) {
    unsigned long long start = now_ns();
    for (unsigned long long i = 0; i < n; i++) {
        unsigned long long until = now_ns() + spin_ns;
        while (now_ns() < until) {
        }
        launch_kernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    }
    return now_ns() - start;
}
