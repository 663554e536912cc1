// The exported `dlsym`'s machine code, one copy for the core (`hooks/dlsym.rs`) and the front
// (`shim/front/lib.rs`, which `include!`s this file: it is built by rustc outside the crate).
// Plain comments, not `//!`: an included file cannot carry inner attributes.
//
// `dlsym_trampoline!(decide, real, resolve)` expands to the body of a naked
// `dlsym(handle, symbol)`: RTLD_NEXT tail-jumps to the real dlsym with the caller's return
// address intact (glibc resolves RTLD_NEXT relative to it); any other handle asks
// `decide(handle, symbol, caller)`: 0 = the real dlsym answers (tail-jump again), 1 = NULL,
// anything else is the answer. The real dlsym is the static slot `real`, or `resolve()` while
// that slot is still empty. Before asking `decide`, a NULL name, or one that neither starts
// with 'n' nor with "cu" and a capital, tail-jumps to the real dlsym at once (every hooked
// name is `cu[A-Z]*` or `nvml[A-Z]*`, a unit test of `hooks/dlsym.rs` holds the registry to
// it, and both deciders forward everything else): the names Python and the loader look up by
// the thousand, `cudnn*` and `cublas*` included, cost a few compares.

#[cfg(target_arch = "x86_64")]
macro_rules! dlsym_trampoline {
    ($decide:path, $real:path, $resolve:path) => {
        core::arch::naked_asm!(
        // RTLD_NEXT == (void*)-1: never look, tail-jump with the caller's return address.
        "cmp rdi, -1",
        "je 2f",
        // First byte of the name: only 'c' or 'n' can start a hooked name.
        "test rsi, rsi",
        "jz 2f",
        "movzx eax, byte ptr [rsi]",
        "cmp eax, 0x63",
        "jne 7f",
        // "cu" and a capital (bytes 1 and 2 exist: the ones before are not NUL).
        "cmp byte ptr [rsi + 1], 0x75",
        "jne 2f",
        "movzx eax, byte ptr [rsi + 2]",
        "sub eax, 0x41",
        "cmp eax, 25",
        "ja 2f",
        "jmp 6f",
        "7:",
        "cmp eax, 0x6e",
        "jne 2f",
        "6:",
        // Entry rsp = 8 mod 16; two pushes + 8 make it 0 mod 16 at the call.
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        // Third argument: the caller's return address (RTLD_DEFAULT's scope depends on it).
        "mov rdx, qword ptr [rsp + 24]",
        "call {decide}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 2f",
        // ANSWER_NULL (1): the answer is NULL.
        "cmp rax, 1",
        "jne 5f",
        "xor eax, eax",
        "5:",
        "ret",
        "2:",
        "mov rax, qword ptr [rip + {real}]",
        "test rax, rax",
        "jz 3f",
        "jmp rax",
        "3:",
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {resolve}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 4f",
        "jmp rax",
        "4:",
        "ret",
            decide = sym $decide,
            real = sym $real,
            resolve = sym $resolve,
        )
    };
}

#[cfg(target_arch = "aarch64")]
macro_rules! dlsym_trampoline {
    ($decide:path, $real:path, $resolve:path) => {
        core::arch::naked_asm!(
        // RTLD_NEXT == (void*)-1: tail-branch with x30 (the caller's return address) intact.
        "cmn x0, #1",
        "b.eq 2f",
        // First byte of the name: only 'c' or 'n' can start a hooked name.
        "cbz x1, 2f",
        "ldrb w16, [x1]",
        "cmp w16, #0x63",
        "b.ne 7f",
        // "cu" and a capital (bytes 1 and 2 exist: the ones before are not NUL).
        "ldrb w16, [x1, #1]",
        "cmp w16, #0x75",
        "b.ne 2f",
        "ldrb w16, [x1, #2]",
        "sub w16, w16, #0x41",
        "cmp w16, #25",
        "b.hi 2f",
        "b 6f",
        "7:",
        "cmp w16, #0x6e",
        "b.ne 2f",
        "6:",
        "stp x29, x30, [sp, #-32]!",
        "mov x29, sp",
        "stp x0, x1, [sp, #16]",
        // Third argument: the caller's return address (RTLD_DEFAULT's scope depends on it).
        "mov x2, x30",
        "bl {decide}",
        "mov x16, x0",
        "ldp x0, x1, [sp, #16]",
        "ldp x29, x30, [sp], #32",
        "cbz x16, 2f",
        // ANSWER_NULL (1): the answer is NULL.
        "mov x0, x16",
        "cmp x16, #1",
        "b.ne 5f",
        "mov x0, #0",
        "5:",
        "ret",
        "2:",
        "adrp x16, {real}",
        "ldr x16, [x16, :lo12:{real}]",
        "cbz x16, 3f",
        "br x16",
        "3:",
        "stp x29, x30, [sp, #-32]!",
        "mov x29, sp",
        "stp x0, x1, [sp, #16]",
        "bl {resolve}",
        "mov x16, x0",
        "ldp x0, x1, [sp, #16]",
        "ldp x29, x30, [sp], #32",
        "cbz x16, 4f",
        "br x16",
        "4:",
        "mov x0, #0",
        "ret",
            decide = sym $decide,
            real = sym $real,
            resolve = sym $resolve,
        )
    };
}
