/* LD_PRELOAD library: the process sees a CPU without AVX-512 and AMX (ISA_CAP=avx2), without AVX-512 bf16/fp16 and
 * AMX (avx512), or without AMX (avx512_bf16), in CPUID and in /proc/cpuinfo's flags alike, so every library that picks
 * its kernels from them (XLA's LLVM JIT, YNNPACK, oneDNN, numpy, our cpu_gemm) picks what it would on that CPU kind.
 *
 * CPUID: Linux's CPUID faulting (arch_prctl ARCH_SET_CPUID, x86 flag cpuid_fault) makes every CPUID instruction
 * raise SIGSEGV; the handler runs it with faulting off, clears the hidden bits and steps over it. Threads and fork
 * inherit faulting, exec resets it (the library is preloaded again). Programs that install their own SIGSEGV handler
 * get it chained behind this one. /proc/cpuinfo: open() of that path returns a copy without the hidden flags.
 * Built and used by benchmarks/isa_cap.py. */
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <cpuid.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#define BIT(n) (1u << (n))
enum { AVX2, AVX512, AVX512_BF16 };
static int level;
static struct sigaction app_segv; /* the program's own SIGSEGV disposition, run for faults that aren't CPUID */
static int (*real_sigaction)(int, const struct sigaction *, struct sigaction *);

static void mask(uint32_t leaf, uint32_t sub, uint32_t r[4]) {
  if (leaf == 7 && sub == 0) {
    if (level == AVX2) {
      r[1] &= ~(BIT(16) | BIT(17) | BIT(21) | BIT(26) | BIT(27) | BIT(28) | BIT(30) | BIT(31)); /* avx512 f dq ifma
                                                                                                   pf er cd bw vl */
      r[2] &= ~(BIT(1) | BIT(6) | BIT(11) | BIT(12) | BIT(14)); /* vbmi vbmi2 vnni bitalg vpopcntdq */
      r[3] &= ~(BIT(2) | BIT(3) | BIT(8));                      /* 4vnniw 4fmaps vp2intersect */
    }
    if (level <= AVX512) r[3] &= ~BIT(23);   /* avx512_fp16 */
    r[3] &= ~(BIT(22) | BIT(24) | BIT(25)); /* amx_bf16 amx_tile amx_int8 */
  } else if (leaf == 7 && sub == 1) {
    if (level == AVX2) r[0] &= ~(BIT(4) | BIT(23)); /* avx_vnni avx_ifma */
    if (level <= AVX512) r[0] &= ~BIT(5);           /* avx512_bf16 */
    r[0] &= ~BIT(21);                                /* amx_fp16 */
    r[3] &= ~(BIT(4) | BIT(5) | BIT(19));            /* avx_vnni_int8 avx_ne_convert avx10 */
  } else if (leaf == 0xd && sub == 0) {
    if (level == AVX2) r[0] &= ~(BIT(5) | BIT(6) | BIT(7)); /* AVX-512 state */
    r[0] &= ~(BIT(17) | BIT(18));                           /* AMX tile state */
  }
}

static int hidden_flag(const char *flag, size_t n) {
  if (n >= 3 && !strncmp(flag, "amx", 3)) return 1;
  if (n == 14 && !strncmp(flag, "avx_ne_convert", n)) return 1;
  if (n == 13 && !strncmp(flag, "avx_vnni_int8", n)) return 1;
  if (level <= AVX512 && ((n == 11 && !strncmp(flag, "avx512_bf16", n)) || (n == 11 && !strncmp(flag, "avx512_fp16", n))))
    return 1;
  if (level == AVX2 && ((n >= 6 && !strncmp(flag, "avx512", 6)) || (n == 8 && !strncmp(flag, "avx_vnni", n)) ||
                        (n == 8 && !strncmp(flag, "avx_ifma", n))))
    return 1;
  return 0;
}

static void on_segv(int sig, siginfo_t *si, void *ctx) {
  ucontext_t *uc = ctx;
  greg_t *g = uc->uc_mcontext.gregs;
  const unsigned char *ip = (const unsigned char *)g[REG_RIP];
  if (si->si_code == SI_KERNEL && ip && ip[0] == 0x0f && ip[1] == 0xa2) {
    uint32_t r[4], leaf = (uint32_t)g[REG_RAX], sub = (uint32_t)g[REG_RCX];
    syscall(SYS_arch_prctl, ARCH_SET_CPUID, 1);
    __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
    syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0);
    mask(leaf, sub, r);
    g[REG_RAX] = r[0];
    g[REG_RBX] = r[1];
    g[REG_RCX] = r[2];
    g[REG_RDX] = r[3];
    g[REG_RIP] += 2;
    return;
  }
  if (app_segv.sa_flags & SA_SIGINFO) {
    app_segv.sa_sigaction(sig, si, ctx);
  } else if (app_segv.sa_handler != SIG_DFL && app_segv.sa_handler != SIG_IGN) {
    app_segv.sa_handler(sig);
  } else { /* back to the default: the fault recurs on return and ends the process as it would have */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    real_sigaction(SIGSEGV, &dfl, NULL);
  }
}

int sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
  if (!real_sigaction) real_sigaction = dlsym(RTLD_NEXT, "sigaction");
  if (sig != SIGSEGV) return real_sigaction(sig, act, old);
  if (old) *old = app_segv;
  if (act) app_segv = *act;
  return 0;
}

sighandler_t signal(int sig, sighandler_t handler) {
  struct sigaction act, old;
  memset(&act, 0, sizeof act);
  act.sa_handler = handler;
  act.sa_flags = SA_RESTART;
  if (sigaction(sig, &act, &old) != 0) return SIG_ERR;
  return old.sa_handler;
}

/* /proc/cpuinfo without the hidden flags, as an anonymous file; -1 (errno set) where that fails. */
static int filtered_cpuinfo(void) {
  int in = (int)syscall(SYS_openat, AT_FDCWD, "/proc/cpuinfo", O_RDONLY | O_CLOEXEC);
  if (in < 0) return -1;
  size_t cap = 1 << 16, len = 0;
  char *text = malloc(cap);
  ssize_t got;
  while (text && (got = read(in, text + len, cap - len)) > 0) {
    len += (size_t)got;
    if (len == cap) text = realloc(text, cap *= 2);
  }
  close(in);
  int out = (int)syscall(SYS_memfd_create, "cpuinfo", MFD_CLOEXEC);
  if (!text || out < 0) {
    free(text);
    return -1;
  }
  for (size_t i = 0; i < len;) {
    size_t end = i;
    while (end < len && text[end] != '\n') end++;
    if (!strncmp(text + i, "flags", 5)) {
      size_t colon = i;
      while (colon < end && text[colon] != ':') colon++;
      if (write(out, text + i, colon + 1 - i) < 0) break;
      for (size_t w = colon + 1; w < end;) {
        while (w < end && text[w] == ' ') w++;
        size_t n = 0;
        while (w + n < end && text[w + n] != ' ') n++;
        if (n && !hidden_flag(text + w, n) && (write(out, " ", 1) < 0 || write(out, text + w, n) < 0)) break;
        w += n;
      }
      if (write(out, "\n", 1) < 0) break;
    } else if (write(out, text + i, end + 1 - i > len - i ? len - i : end + 1 - i) < 0) {
      break;
    }
    i = end + 1;
  }
  free(text);
  lseek(out, 0, SEEK_SET);
  return out;
}

static int is_cpuinfo(const char *path) { return path && !strcmp(path, "/proc/cpuinfo"); }

static unsigned mode_arg(int flags, va_list ap) { return (flags & (O_CREAT | O_TMPFILE)) ? va_arg(ap, unsigned) : 0; }

static int reads_cpuinfo(const char *path, int flags) { return is_cpuinfo(path) && !(flags & (O_WRONLY | O_RDWR)); }

int open(const char *path, int flags, ...) {
  static int (*real)(const char *, int, ...);
  va_list ap;
  va_start(ap, flags);
  unsigned mode = mode_arg(flags, ap);
  va_end(ap);
  if (reads_cpuinfo(path, flags)) return filtered_cpuinfo();
  if (!real) real = dlsym(RTLD_NEXT, "open");
  return real(path, flags, mode);
}

int open64(const char *path, int flags, ...) {
  static int (*real)(const char *, int, ...);
  va_list ap;
  va_start(ap, flags);
  unsigned mode = mode_arg(flags, ap);
  va_end(ap);
  if (reads_cpuinfo(path, flags)) return filtered_cpuinfo();
  if (!real) real = dlsym(RTLD_NEXT, "open64");
  return real(path, flags, mode);
}

int openat(int dirfd, const char *path, int flags, ...) {
  static int (*real)(int, const char *, int, ...);
  va_list ap;
  va_start(ap, flags);
  unsigned mode = mode_arg(flags, ap);
  va_end(ap);
  if (reads_cpuinfo(path, flags)) return filtered_cpuinfo();
  if (!real) real = dlsym(RTLD_NEXT, "openat");
  return real(dirfd, path, flags, mode);
}

int openat64(int dirfd, const char *path, int flags, ...) {
  static int (*real)(int, const char *, int, ...);
  va_list ap;
  va_start(ap, flags);
  unsigned mode = mode_arg(flags, ap);
  va_end(ap);
  if (reads_cpuinfo(path, flags)) return filtered_cpuinfo();
  if (!real) real = dlsym(RTLD_NEXT, "openat64");
  return real(dirfd, path, flags, mode);
}

FILE *fopen(const char *path, const char *how) {
  static FILE *(*real)(const char *, const char *);
  if (is_cpuinfo(path) && how[0] == 'r' && !strchr(how, '+')) {
    int fd = filtered_cpuinfo();
    return fd < 0 ? NULL : fdopen(fd, "r");
  }
  if (!real) real = dlsym(RTLD_NEXT, "fopen");
  return real(path, how);
}

FILE *fopen64(const char *path, const char *how) { return fopen(path, how); }

__attribute__((constructor)) static void install(void) {
  real_sigaction = dlsym(RTLD_NEXT, "sigaction");
  const char *cap = getenv("ISA_CAP");
  level = !cap                        ? -1
          : !strcmp(cap, "avx2")        ? AVX2
          : !strcmp(cap, "avx512")      ? AVX512
          : !strcmp(cap, "avx512_bf16") ? AVX512_BF16
                                        : -1;
  if (level < 0) {
    fprintf(stderr, "isa_cap: ISA_CAP=%s: set it to avx2, avx512 or avx512_bf16\n", cap ? cap : "(unset)");
    _exit(2);
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO | SA_NODEFER;
  real_sigaction(SIGSEGV, &sa, NULL);
  if (syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0) != 0) {
    fprintf(stderr, "isa_cap: this kernel or CPU has no CPUID faulting (x86 flag cpuid_fault)\n");
    _exit(2);
  }
}
