/* A libcuda.so.1 for machines without an NVIDIA driver (scripts/te/python.sh puts it on the library path only there).
 * cuDNN's runtime-compiled engines and TE's libnccl_ep link the driver API directly, so loading Transformer Engine
 * needs these symbols to exist; every call answers CUDA_ERROR_NO_DEVICE (jax then falls back to its CPU backend).
 * Lowering for CUDA (jax.export(..., platforms=["cuda"])) never calls the driver. The symbol list is what
 * `nm -D --undefined-only` shows those libraries need from libcuda (cuDNN 9.28, TE 2.20), plus the entry points a
 * driver probe calls first. */
typedef int CUresult;
enum { CUDA_SUCCESS = 0, CUDA_ERROR_NO_DEVICE = 100 };

/* Entry points that only report the missing device; callers get nothing back through their pointer arguments.
 * (An unprototyped C function returning int is called the same way whatever arguments the caller passes.) */
#define NO_DEVICE(name) CUresult name() { return CUDA_ERROR_NO_DEVICE; }
NO_DEVICE(cuInit)
NO_DEVICE(cuCtxGetCurrent)
NO_DEVICE(cuDeviceGet)
NO_DEVICE(cuFuncSetAttribute)
NO_DEVICE(cuLaunchKernel)
NO_DEVICE(cuLaunchKernelEx)
NO_DEVICE(cuModuleGetFunction)
NO_DEVICE(cuModuleLoadData)
NO_DEVICE(cuModuleLoadDataEx)
NO_DEVICE(cuModuleUnload)
NO_DEVICE(cuTensorMapEncodeIm2col)
NO_DEVICE(cuTensorMapEncodeTiled)

CUresult cuDriverGetVersion(int *version) {
  if (version) *version = 0;
  return CUDA_ERROR_NO_DEVICE;
}

CUresult cuDeviceGetCount(int *count) {
  if (count) *count = 0;
  return CUDA_ERROR_NO_DEVICE;
}

/* The driver's symbol lookup (runtime and TE's loader use it): no function is found. */
CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags, int *status) {
  (void)symbol; (void)version; (void)flags;
  if (pfn) *pfn = 0;
  if (status) *status = 0;
  return CUDA_ERROR_NO_DEVICE;
}
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags, int *status) {
  return cuGetProcAddress(symbol, pfn, version, flags, status);
}

CUresult cuGetErrorString(CUresult error, const char **text) {
  if (text) *text = error == CUDA_ERROR_NO_DEVICE ? "no CUDA-capable device (libcuda stub: no NVIDIA driver here)"
                                                  : "unknown error (libcuda stub: no NVIDIA driver here)";
  return CUDA_SUCCESS;
}

CUresult cuGetErrorName(CUresult error, const char **text) {
  if (text) *text = error == CUDA_ERROR_NO_DEVICE ? "CUDA_ERROR_NO_DEVICE" : "CUDA_ERROR_UNKNOWN";
  return CUDA_SUCCESS;
}
