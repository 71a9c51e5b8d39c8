// AVX2 kernels on an AVX-512 CPU, for `make bench-onnx-avx2`: an LD_PRELOAD library that hides the
// AVX-512, VNNI (AVX-512 and AVX) and AMX bits of CPUID from the process, so libraries that choose
// their kernels by CPUID (ONNX Runtime's MLAS, torch's ATen and oneDNN) take their AVX2 paths.
//
// Linux's CPUID faulting (arch_prctl ARCH_SET_CPUID, the CPU flag `cpuid_fault`) makes every CPUID
// instruction raise SIGSEGV; the handler runs the real CPUID with faulting briefly off, clears the
// bits and steps over the instruction. The setting is per thread and inherited by new threads and
// child processes (LD_PRELOAD loads the library again after exec). The cores are still the AVX-512
// CPU's: this measures the AVX2 kernels, not an AVX2 CPU's memory or clocks.
//
//   gcc -O2 -shared -fPIC -o runs/avx2_kernels.so benchmarks/avx2_kernels.c
//   LD_PRELOAD=runs/avx2_kernels.so python -c "import torch; print(torch.backends.cpu.get_cpu_capability())"  # AVX2
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#define BIT(n) (1u << (n))
// Leaf 7, subleaf 0. EBX: avx512f, dq, ifma, pf, er, cd, bw, vl.
#define HIDDEN_7_0_EBX (BIT(16) | BIT(17) | BIT(21) | BIT(26) | BIT(27) | BIT(28) | BIT(30) | BIT(31))
// ECX: avx512_vbmi, vbmi2, vnni, bitalg, vpopcntdq.
#define HIDDEN_7_0_ECX (BIT(1) | BIT(6) | BIT(11) | BIT(12) | BIT(14))
// EDX: avx512_4vnniw, 4fmaps, vp2intersect, amx_bf16, avx512_fp16, amx_tile, amx_int8.
#define HIDDEN_7_0_EDX (BIT(2) | BIT(3) | BIT(8) | BIT(22) | BIT(23) | BIT(24) | BIT(25))
// Leaf 7, subleaf 1. EAX: avx_vnni, avx512_bf16, amx_fp16, avx_ifma.
#define HIDDEN_7_1_EAX (BIT(4) | BIT(5) | BIT(21) | BIT(23))

static long cpuid_faulting(int off) { return syscall(SYS_arch_prctl, ARCH_SET_CPUID, off); }

static void on_segv(int signal_number, siginfo_t *info, void *context) {
    (void)info;
    greg_t *registers = ((ucontext_t *)context)->uc_mcontext.gregs;
    const uint8_t *instruction = (const uint8_t *)registers[REG_RIP];
    if (instruction[0] != 0x0f || instruction[1] != 0xa2) {  // not CPUID: a real fault, crash as usual
        signal(signal_number, SIG_DFL);
        return;
    }
    uint32_t leaf = (uint32_t)registers[REG_RAX], subleaf = (uint32_t)registers[REG_RCX], a, b, c, d;
    cpuid_faulting(1);
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(leaf), "c"(subleaf));
    cpuid_faulting(0);
    if (leaf == 7 && subleaf == 0) {
        b &= ~HIDDEN_7_0_EBX;
        c &= ~HIDDEN_7_0_ECX;
        d &= ~HIDDEN_7_0_EDX;
    } else if (leaf == 7 && subleaf == 1) {
        a &= ~HIDDEN_7_1_EAX;
    }
    registers[REG_RAX] = a, registers[REG_RBX] = b, registers[REG_RCX] = c, registers[REG_RDX] = d;
    registers[REG_RIP] += 2;  // CPUID is two bytes
}

__attribute__((constructor)) static void hide_avx512(void) {
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_segv;
    action.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigaction(SIGSEGV, &action, NULL);
    if (cpuid_faulting(0) != 0) {  // no silent AVX-512 run: stop
        static const char message[] = "avx2_kernels.so: this CPU or kernel has no CPUID faulting (ARCH_SET_CPUID)\n";
        (void)!write(2, message, sizeof message - 1);
        _exit(2);
    }
}
