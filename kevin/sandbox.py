"""Box in a process that runs candidate code, with what Linux offers an unprivileged process.

A candidate is code a policy wrote while optimised for reward; the evaluator's children run it. Once
`confine` has run in a child (before any candidate code, while the child is still single-threaded):

- Landlock: only the folders named `write` (its own build folder and private tmp), /dev and its own /proc
  entries can be written; what `read` names (the system, Python, torch, the tasks, the build cache) can be
  read and executed; nothing else is visible. A Landlock domain also cannot ptrace, nor open the /proc fd
  and memory files of, a process outside it: the evaluator's stdout, its -o file, its memory are out of
  reach. ABI 4 adds no TCP bind/connect; ABI 6 no signals to, and no abstract sockets of, outside processes.
- A user and a network namespace: no network device at all (UDP and raw sockets included), and no
  capability over anything the namespace does not own (as root: no sysctl, no mount).
- A mount namespace (`private_shm`): a fresh tmpfs on /dev/shm, empty at the start, seen by no other child
  and gone with the process, so that shared memory is no channel between candidates.
- seccomp: a process that opens an internet or packet socket, or calls ptrace, process_vm_*, pidfd_getfd,
  mount, unshare, setns, bpf or keyctl, or maps pages it has mapped a second time (mremap of size 0 or
  MREMAP_DONTUNMAP, remap_file_pages), is killed by SIGSYS, which the evaluator reports as the rule it broke;
  with `forbid_processes`, so is one that starts a process (fork, vfork, clone without CLONE_THREAD) or execs
  a program, so that nothing of a candidate's outlives its child or runs outside its filter. Threads still
  start: clone3 answers ENOSYS (its flags sit in memory a filter cannot read) and glibc falls back to clone.
  `connect` answers EACCES: its only channels are the connected ones it was given (a new unix socket may be
  made, as CUDA's driver does as it starts, but connects to nothing).
- Not dumpable: no process of the same user may ptrace it or open its /proc memory and descriptors.

Each layer is applied where the kernel has it; `available()` says which, `--sandbox strict` refuses to run
without all of them. Denied file writes are plain EACCES to the candidate: nothing it does outside its
folders takes effect, though a candidate that swallows the error is not reported for trying.
Nothing here needs root, and nothing is installed: the syscalls are made through ctypes.
"""
from __future__ import annotations

import ctypes
import os
import platform
import struct
import subprocess
import sys

_LIBC = ctypes.CDLL(None, use_errno=True)
_ARCH = platform.machine()
# syscall numbers and seccomp's audit arch, per architecture
_SYSCALLS = {
    "x86_64": dict(audit_arch=0xC000003E, landlock_create_ruleset=444, landlock_add_rule=445,
                   landlock_restrict_self=446, socket=41, ptrace=101, process_vm_readv=310,
                   process_vm_writev=311, mount=165, umount2=166, pivot_root=155, chroot=161, setns=308,
                   unshare=272, bpf=321, keyctl=250, add_key=248, request_key=249, fork=57, vfork=58, clone=56,
                   clone3=435, execve=59, execveat=322, connect=42, mremap=25, remap_file_pages=216,
                   pidfd_getfd=438),
    "aarch64": dict(audit_arch=0xC00000B7, landlock_create_ruleset=444, landlock_add_rule=445,
                    landlock_restrict_self=446, socket=198, ptrace=117, process_vm_readv=270,
                    process_vm_writev=271, mount=40, umount2=39, pivot_root=41, chroot=51, setns=268,
                    unshare=97, bpf=280, keyctl=219, add_key=217, request_key=218, clone=220, clone3=435,
                    execve=221, execveat=281, connect=203, mremap=216, remap_file_pages=234,
                    pidfd_getfd=438),  # no fork or vfork: clone does both
}.get(_ARCH)
_FORBIDDEN_CALLS = ("ptrace", "process_vm_readv", "process_vm_writev", "mount", "umount2", "pivot_root",
                    "chroot", "setns", "unshare", "bpf", "keyctl", "add_key", "request_key", "pidfd_getfd",
                    "remap_file_pages")
_PROCESS_CALLS = ("fork", "vfork", "execve", "execveat")
_FORBIDDEN_SOCKETS = (2, 10, 17)  # AF_INET, AF_INET6, AF_PACKET
_EACCES, _MREMAP_DONTUNMAP = 13, 4
MECHANISMS = ("landlock", "namespaces", "mount_namespace", "seccomp")
SHM_SIZE = "1g"  # a child's private /dev/shm: far more than a kernel needs, far less than the machine's memory

# Landlock access rights (linux/landlock.h), by the ABI version that introduced them
_FS_EXECUTE, _FS_READ_FILE, _FS_READ_DIR = 1 << 0, 1 << 2, 1 << 3
_FILE_RIGHTS = _FS_EXECUTE | 1 << 1 | _FS_READ_FILE | 1 << 14 | 1 << 15  # + write, truncate, ioctl
_FS_RIGHTS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
_NET_TCP_BIND_CONNECT, _SCOPE_ABSTRACT_UNIX_SIGNAL = 0b11, 0b11
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _PR_SET_DUMPABLE = 38, 22, 4
_CLONE_NEWUSER, _CLONE_NEWNET, _CLONE_NEWNS, _CLONE_THREAD = 0x10000000, 0x40000000, 0x00020000, 0x00010000
_MS_NOSUID, _MS_NODEV, _MS_REC, _MS_PRIVATE = 2, 4, 1 << 14, 1 << 18


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 where Landlock is missing or disabled."""
    if _SYSCALLS is None:
        return 0
    version = _LIBC.syscall(_SYSCALLS["landlock_create_ruleset"], None, 0, 1)  # ..._VERSION flag
    return max(0, version)


def _namespaces_work(private_shm: bool = False) -> bool:
    """Whether a process here may enter a new user and network namespace (with `private_shm`, a mount namespace
    too, with its own /dev/shm); tried in a throwaway process."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    probe = f"import sys; sys.path.insert(0, {repo!r}); " \
            f"from kevin import sandbox; sandbox._enter_namespaces({private_shm})"
    return subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True).returncode == 0


def available() -> dict[str, bool]:
    """Which of MECHANISMS this kernel offers (checked once per run, in the evaluator)."""
    seccomp = _SYSCALLS is not None and os.path.exists("/proc/sys/kernel/seccomp/actions_avail")
    namespaces = _namespaces_work()
    return {"landlock": landlock_abi() >= 1, "namespaces": namespaces,
            "mount_namespace": namespaces and _namespaces_work(private_shm=True), "seccomp": seccomp}


def describe(in_force: dict[str, bool]) -> str:
    """One line for the start of a run: what is on, what the kernel lacks."""
    abi = landlock_abi()
    on = {"landlock": f"landlock ABI {abi} (files, ptrace{', tcp' if abi >= 4 else ''}"
                      f"{', signals' if abi >= 6 else ''})",
          "namespaces": "user+network namespaces (no network)",
          "mount_namespace": "a private /dev/shm (mount namespace)",
          "seccomp": "seccomp (network and ptrace calls; new processes where candidate code runs)"}
    parts = [on[m] for m in MECHANISMS if in_force.get(m)]
    missing = [m for m in MECHANISMS if not in_force.get(m)]
    line = "sandbox: " + (", ".join(parts) if parts else "off")
    return line + (f"; not available here: {', '.join(missing)}" if missing and parts else "")


def make_undumpable() -> None:
    """This process not dumpable, so that same-user processes cannot ptrace it or open its /proc fd and memory
    files (root still can: there Landlock's ptrace rule is what protects it): the evaluator, and every boxed child."""
    _LIBC.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)


def confine(write: list[str], read: list[str], mechanisms: dict[str, bool], forbid_processes: bool = False,
            private_shm: bool = False, scoped: bool = True) -> None:
    """Box in the calling process (single-threaded: namespaces and seccomp need it, and Landlock binds only
    the calling thread and the threads it starts later). `forbid_processes`: seccomp also kills it for starting
    a process or exec'ing a program (for children that run candidate code: they need threads, never a
    process). `private_shm`: its own empty /dev/shm, where the mount namespace is among `mechanisms`. Unless
    `scoped`, it may still signal processes outside its Landlock domain (the judge stops and kills its runner).
    Raises OSError where a mechanism asked for fails."""
    if not any(mechanisms.values()):
        return
    if mechanisms.get("namespaces"):
        _enter_namespaces(private_shm and bool(mechanisms.get("mount_namespace")))
    if _LIBC.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        _raise("prctl(PR_SET_NO_NEW_PRIVS)")
    if mechanisms.get("landlock"):
        _landlock(write, read, scoped)  # after the mount: a Landlock domain may not mount
    if mechanisms.get("seccomp"):
        _seccomp(forbid_processes)
    make_undumpable()


def readable(extra: list[str], hidden: list[str]) -> list[str]:
    """What a child may read: the system, this Python and its packages (torch and its headers), CUDA, and
    `extra`; but no folder holding one of `hidden` (the socket of multiprocessing's fork server, say, which
    Landlock cannot keep a process from connecting to once it knows the path)."""
    paths = ["/usr", "/lib", "/lib32", "/lib64", "/bin", "/sbin", "/etc", "/opt", "/sys", "/proc", "/run",
             sys.prefix, sys.base_prefix, sys.exec_prefix, os.environ.get("CUDA_HOME", "/usr/local/cuda"),
             *sys.path, *extra]
    hidden = [os.path.realpath(h) for h in hidden]
    paths = {os.path.realpath(p) for p in paths if p and os.path.exists(p)}
    return sorted(p for p in paths if not any(h == p or h.startswith(p.rstrip("/") + "/") for h in hidden))


def _enter_namespaces(private_shm: bool = False) -> None:
    """A new user and network namespace; with `private_shm`, a mount namespace too, whose /dev/shm is a fresh
    tmpfs of SHM_SIZE (unmounted with the namespace, when the process ends)."""
    uid, gid = os.getuid(), os.getgid()
    if _LIBC.unshare(_CLONE_NEWUSER | _CLONE_NEWNET | (_CLONE_NEWNS if private_shm else 0)) != 0:
        _raise(f"unshare(CLONE_NEWUSER | CLONE_NEWNET{' | CLONE_NEWNS' if private_shm else ''})")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:  # the same ids inside as out: files keep their owners
            f.write(text)
    if private_shm:
        if _LIBC.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:  # nothing propagates out
            _raise("mount(/, MS_PRIVATE)")
        if _LIBC.mount(b"tmpfs", b"/dev/shm", b"tmpfs", _MS_NOSUID | _MS_NODEV,
                       f"size={SHM_SIZE},mode=1777".encode()) != 0:
            _raise("mount(tmpfs, /dev/shm)")


def _landlock(write: list[str], read: list[str], scoped: bool) -> None:
    abi = landlock_abi()
    fs_rights = _FS_RIGHTS_BY_ABI[max(v for v in _FS_RIGHTS_BY_ABI if v <= abi)]
    attr = _RulesetAttr(fs_rights, _NET_TCP_BIND_CONNECT if abi >= 4 else 0,
                        _SCOPE_ABSTRACT_UNIX_SIGNAL if abi >= 6 and scoped else 0)
    ruleset = _LIBC.syscall(_SYSCALLS["landlock_create_ruleset"], ctypes.byref(attr), ctypes.sizeof(attr), 0)
    if ruleset < 0:
        _raise("landlock_create_ruleset")
    try:
        read_rights = _FS_EXECUTE | _FS_READ_FILE | _FS_READ_DIR
        rules = [(p, read_rights) for p in read] + [(p, fs_rights) for p in [*write, "/dev", "/proc/self"]]
        for path, rights in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                if not os.path.isdir(path):  # a file takes only the rights that apply to files
                    rights &= _FILE_RIGHTS
                beneath = struct.pack("=Qi", rights, fd)  # struct landlock_path_beneath_attr, packed
                if _LIBC.syscall(_SYSCALLS["landlock_add_rule"], ruleset, 1, beneath, 0) != 0:
                    _raise(f"landlock_add_rule({path})")
            finally:
                os.close(fd)
        if _LIBC.syscall(_SYSCALLS["landlock_restrict_self"], ruleset, 0) != 0:
            _raise("landlock_restrict_self")
    finally:
        os.close(ruleset)


def _seccomp(forbid_processes: bool) -> None:
    """A classic BPF filter: kill the process on a forbidden call or socket family, allow the rest. Nothing outside
    the box can be talked to: `connect` answers EACCES (a child's only channels are the connected ones it was
    given; the fork server's socket, whose path a child can find in its own memory, would fork anything it is sent,
    unboxed; a new unix socket is allowed, since CUDA's driver fails to start without one), and a second mapping of memory already mapped (mremap of size 0, or
    keeping the old one, remap_file_pages) kills, so that no output can be an input's pages under another address.
    With `forbid_processes`: fork, vfork, exec and a clone without CLONE_THREAD are forbidden calls too, and
    clone3 answers ENOSYS (glibc then starts its threads with clone)."""
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ/JGE/JSET|K, BPF_RET|K
    forbidden = _FORBIDDEN_CALLS + tuple(c for c in _PROCESS_CALLS if forbid_processes and c in _SYSCALLS)
    program = [(ld, 4), (jeq, _SYSCALLS["audit_arch"], "next", "kill"), (ld, 0)]  # seccomp_data.arch, .nr
    if _ARCH == "x86_64":
        program.append((jge, 0x40000000, "kill", "next"))  # the x32 ABI's calls
    program += [(jeq, _SYSCALLS[name], "kill", "next") for name in forbidden]
    program.append((jeq, _SYSCALLS["connect"], "eacces", "next"))
    if forbid_processes:  # clone's first argument: its flags (low word), on both architectures
        program += [(jeq, _SYSCALLS["clone3"], "enosys", "next"), (jeq, _SYSCALLS["clone"], "next", "not_clone"),
                    (ld, 16), (jset, _CLONE_THREAD, "allow", "kill"), "not_clone"]
    # mremap(old, old_size, new_size, flags, ...): old_size (argument 1, two words at 24) of 0 on a shared mapping
    # maps its pages again; MREMAP_DONTUNMAP in flags (argument 3, low word at 40) leaves the old mapping there
    program += [(jeq, _SYSCALLS["mremap"], "next", "not_mremap"), (ld, 24), (jeq, 0, "next", "mremap_flags"),
                (ld, 28), (jeq, 0, "kill", "next"), "mremap_flags", (ld, 40),
                (jset, _MREMAP_DONTUNMAP, "kill", "allow"), "not_mremap"]
    program += [(jeq, _SYSCALLS["socket"], "next", "allow"), (ld, 16)]  # socket's first argument: the family
    program += [(jeq, family, "kill", "next") for family in _FORBIDDEN_SOCKETS]
    # ALLOW, KILL (SECCOMP_RET_KILL_PROCESS), ERRNO(ENOSYS), ERRNO(EACCES)
    program += ["allow", (ret, 0x7FFF0000), "kill", (ret, 0x80000000), "enosys", (ret, 0x00050000 | 38),
                "eacces", (ret, 0x00050000 | _EACCES)]
    where, pc = {}, 0
    for step in program:  # a label names the position of the instruction after it
        if isinstance(step, str):
            where[step] = pc
        else:
            pc += 1
    program = [step for step in program if not isinstance(step, str)]
    filters = b""
    for pc, (code, k, *targets) in enumerate(program):
        jt, jf = (0 if t == "next" else where[t] - pc - 1 for t in targets) if targets else (0, 0)
        filters += struct.pack("=HBBI", code, jt, jf, k)
    buffer = ctypes.create_string_buffer(filters, len(filters))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(program), ctypes.addressof(buffer))
    if _LIBC.prctl(_PR_SET_SECCOMP, 2, ctypes.byref(fprog), 0, 0) != 0:  # SECCOMP_MODE_FILTER
        _raise("prctl(PR_SET_SECCOMP)")


def _raise(call: str):
    errno = ctypes.get_errno()
    raise OSError(errno, f"sandbox: {call} failed: {os.strerror(errno)}")
