#!/usr/bin/env python3
"""Sorts a `perf record -g` profile of tfa-host into where its CPU goes.

    bench/hostprofile.py --data perf.data --workload NAME --freq F --requests N

Reads `perf script` of the profile, puts each sample in one category (by the
function it was taken in and, in the kernel, by the system call or fault it
was serving) and prints one JSON record for `bench/report.py`: the samples of
each category and the requests the host answered while it was recorded.
Used by `scripts/bench.sh`; nothing is asserted.

The host is built without frame pointers, so a sample's user-space stack is
not walked reliably: a user-space sample counts where it was taken (its own
function), a kernel sample by the entry point found in its kernel stack,
which the kernel always has. Compiled wasm has no symbols in the host's
profile (the release component has no name section); every sample taken in
it is the component's own code.
"""
import argparse
import json
import re
import subprocess
import sys

# Kernel entry points, from the top of a kernel stack, to the category.
SYSCALLS = {
    "sendto": "kernel_send", "sendmsg": "kernel_send", "writev": "kernel_send",
    "recvfrom": "kernel_recv", "recvmsg": "kernel_recv", "read": "kernel_recv",
    "readv": "kernel_recv", "accept4": "kernel_recv",
    "pread64": "kernel_store", "pwrite64": "kernel_store", "fcntl": "kernel_store",
    "lseek": "kernel_store", "newfstat": "kernel_store", "openat": "kernel_store",
    "ftruncate": "kernel_store", "unlink": "kernel_store", "close": "kernel_store",
    "fsync": "kernel_sync", "fdatasync": "kernel_sync",
    "ioctl": "kernel_memory", "madvise": "kernel_memory", "mprotect": "kernel_memory",
    "mmap": "kernel_memory", "munmap": "kernel_memory", "mremap": "kernel_memory",
    "brk": "kernel_memory",
    "futex": "kernel_wait", "epoll_wait": "kernel_wait", "epoll_pwait": "kernel_wait",
    "epoll_ctl": "kernel_wait", "sched_yield": "kernel_wait", "nanosleep": "kernel_wait",
    "clock_nanosleep": "kernel_wait", "write": "kernel_write",
}

# What each category means, in the order of the report's table.
CATEGORIES = [
    ("wasm", "the component's compiled wasm"),
    ("wasmtime", "wasmtime: instantiation, host calls lifted and lowered, WASI, teardown"),
    ("http", "HTTP: hyper, `http`, `httparse`"),
    ("tokio", "tokio: scheduler, timers, I/O driver"),
    ("host", "tfa-host's own code (store, access log, glue)"),
    ("sqlite", "SQLite's own code"),
    ("libc_mem", "the allocators (mimalloc for the host, glibc's `malloc` for SQLite) and memory copies"),
    ("user_other", "other user-space code (Rust std, serde, hashing)"),
    ("kernel_send", "kernel: sending (TCP over loopback, waking the client)"),
    ("kernel_recv", "kernel: receiving and accepting"),
    ("kernel_store", "kernel: the store's file reads, writes and locks"),
    ("kernel_sync", "kernel: syncing the write-ahead log"),
    ("kernel_write", "kernel: other writes (the request log)"),
    ("kernel_memory", "kernel: resetting and mapping memory (PAGEMAP_SCAN, madvise)"),
    ("kernel_fault", "kernel: page faults (zeroing fresh pages)"),
    ("kernel_wait", "kernel: waits, wake-ups and context switches"),
    ("kernel_other", "kernel: interrupts and the rest"),
]

MEM = re.compile(
    r"^(malloc|free|cfree|calloc|realloc|_int_\w+|malloc_consolidate|unlink_chunk\S*|_?mi_\w+|"
    r"__mem\w+|mem(cpy|move|set|cmp)\w*|__rustc::__r\w+_(alloc|dealloc|realloc)\w*|tcache\w*)"
)


_SQLITE = {}


def sqlite_functions(binary):
    """Names of SQLite's functions in `binary`, static ones included.

    SQLite is one C file linked into the host whole, so its functions lie
    between the first and the last `sqlite3*` symbol in address order; most
    of its internal ones (`btreeNext`, `pagerWalFrames`, `unixRead`, …) do
    not carry the prefix.
    """
    if binary not in _SQLITE:
        names = []
        try:
            out = subprocess.run(["nm", "--defined-only", "-n", binary],
                                 capture_output=True, text=True, errors="replace").stdout
            names = [ln.split()[2] for ln in out.splitlines()
                     if len(ln.split()) >= 3 and ln.split()[1] in "tT"]
        except OSError:
            pass
        marks = [i for i, n in enumerate(names) if n.startswith("sqlite3")]
        _SQLITE[binary] = set(names[marks[0]:marks[-1] + 1]) if marks else set()
    return _SQLITE[binary]


def classify_user(sym, dso):
    if dso.startswith("/tmp/perf-") or dso.endswith(".cwasm") or dso in ("[unknown]", "") or "[JIT]" in dso:
        return "wasm"
    if sym.startswith("sqlite3") or "libsqlite" in dso or (
            dso.startswith("/") and sym in sqlite_functions(dso)):
        return "sqlite"
    if MEM.match(sym):
        return "libc_mem"
    if "libc.so" in dso:
        return "user_other"
    for prefix, cat in (
        ("wasmtime", "wasmtime"), ("cranelift", "wasmtime"), ("<wasmtime", "wasmtime"),
        ("hyper", "http"), ("<hyper", "http"), ("http::", "http"), ("<http::", "http"),
        ("httparse", "http"), ("tokio", "tokio"), ("<tokio", "tokio"), ("mio::", "tokio"),
        ("<mio", "tokio"), ("tfa_host", "host"), ("<tfa_host", "host"),
    ):
        if sym.startswith(prefix):
            return cat
    if "wasmtime" in sym[:80]:
        return "wasmtime"
    if "tfa_host" in sym[:80]:
        return "host"
    return "user_other"


def classify_kernel(names):
    """names: the functions of the kernel part of a stack, leaf first."""
    if any(n.startswith("asm_exc_page_fault") or n.startswith("exc_page_fault") for n in names):
        return "kernel_fault"
    for n in names:
        m = re.match(r"^__(?:x64|se)_sys_(\w+)", n) or re.match(r"^__do_sys_(\w+)", n)
        if m:
            return SYSCALLS.get(m.group(1), "kernel_other")
    if any(n in ("schedule", "__schedule", "finish_task_switch.isra.0") for n in names):
        return "kernel_wait"  # preempted on the way back to user space
    return "kernel_other"


def samples(data):
    proc = subprocess.run(
        ["perf", "script", "-i", data, "-F", "comm,ip,sym,dso"],
        check=True, capture_output=True, text=True, errors="replace",
    )
    stack = []
    for line in proc.stdout.splitlines():
        if not line.strip():
            if stack:
                yield stack
            stack = []
            continue
        if not line.startswith((" ", "\t")):
            continue  # the sample's header (the thread's name)
        m = re.match(r"\s*[0-9a-f]+\s+(.*?)\s+\((.*)\)\s*$", line)
        if not m:
            continue
        sym, dso = m.groups()
        stack.append((re.sub(r"\+0x[0-9a-f]+$", "", sym), dso))
    if stack:
        yield stack


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--workload", required=True)
    ap.add_argument("--freq", type=int, required=True)
    ap.add_argument("--requests", type=int, required=True)
    ap.add_argument("--secs", type=float, required=True)
    a = ap.parse_args()
    counts = {k: 0 for k, _ in CATEGORIES}
    total = 0
    for stack in samples(a.data):
        total += 1
        sym, dso = stack[0]
        if dso == "[kernel.kallsyms]":
            counts[classify_kernel([s for s, d in stack if d == "[kernel.kallsyms]"])] += 1
        else:
            counts[classify_user(sym, dso)] += 1
    json.dump(
        {
            "bench": "profile",
            "workload": a.workload,
            "freq": a.freq,
            "secs": a.secs,
            "requests": a.requests,
            "samples": total,
            "categories": counts,
        },
        sys.stdout,
    )
    print()


if __name__ == "__main__":
    main()
