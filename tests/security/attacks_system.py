"""Cheats on the machine: exhaust what the sandbox is limited to (processes, memory, disk, /tmp, CPU, descriptors),
sabotage the host's cleanup, call what the kernel must refuse (mount, namespaces, ptrace, keyrings, bpf and other
attack surface), escalate through setuid programs, write outside the sandbox, use inherited descriptors.

Each resource attack stays under a bounded multiple of its limit, so a breach is shown without harming the host.
"""

from __future__ import annotations

from tests.security.attack import Attack
from tests.security.attacks_grading import PY

FORK_BOMB = (
    PY
    + """\
import signal
limit, children = @@LIMIT_PROCESSES@@, []
for _ in range(3 * limit):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    children.append(pid)
kit.note(f"{len(children)} processes alive at once (limit {limit})")
if len(children) > limit:
    kit.breach(f"{len(children)} processes at once, over the limit of {limit}")
for pid in children:
    os.kill(pid, signal.SIGKILL)
for pid in children:
    os.waitpid(pid, 0)
"""
)

MEMORY_HOG = (
    PY
    + """\
limit_mb, chunk_mb = @@LIMIT_MEMORY_MB@@, 160
held, pipes, pids = 0, [], []
for _ in range((2 * limit_mb + 256) // chunk_mb):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            data = b"\\x01" * (chunk_mb * 1024 * 1024)
            os.write(write, b"1")
            time.sleep(20)
        except MemoryError:
            os.write(write, b"0")
        os._exit(0)
    pids.append(pid)
    os.close(write)
    if os.read(read, 1) == b"1":
        held += chunk_mb
    pipes.append(read)
time.sleep(1)  # the OOM killer may take a moment: count only the holders still alive
alive = sum(1 for pid in pids if os.waitpid(pid, os.WNOHANG) == (0, 0))
held = min(held, alive * chunk_mb)
kit.note(f"{held} MiB held at once (limit {limit_mb} MiB, {alive} of {len(pids)} holders alive)")
if held > limit_mb + 64:
    kit.breach(f"{held} MiB resident at once, over the sandbox's {limit_mb} MiB")
for pid in pids:
    try:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass
"""
)

DISK_FILLER = (
    PY
    + """\
limit_mb, written = @@LIMIT_DISK_MB@@, 0
Path("fill").mkdir()
block = os.urandom(1024 * 1024)
for i in range(4 * limit_mb):
    try:
        Path("fill", f"{i:05d}.bin").write_bytes(block)
        written += 1
    except OSError as exc:
        kit.note(f"stopped: {exc}")
        break
many = 0
Path("many").mkdir()
for i in range(20000):
    try:
        Path("many", str(i)).touch()
        many += 1
    except OSError:
        break
kit.note(f"wrote {written} MiB in 1 MiB files and {many} empty files (disk limit {limit_mb} MiB)")
if written > limit_mb + 4:
    kit.breach(f"{written} MiB written to the working copy, over disk_mb={limit_mb}")
"""
)

TMP_FILLER = (
    PY
    + """\
limit_mb, total, seen = @@LIMIT_DISK_MB@@, 0, set()
block = os.urandom(1024 * 1024)
for n, directory in enumerate(("/tmp", "/var/tmp", "/dev/shm", "/run", str(Path.home()), ".")):
    try:
        identity = (os.stat(directory).st_dev, os.stat(directory).st_ino)
    except OSError:
        continue
    if identity in seen:
        kit.note(f"{directory} is a directory already filled")
        continue
    seen.add(identity)
    written = 0
    for i in range(2 * limit_mb):
        try:
            Path(directory, f"redteam-fill-{n}-{i:05d}").write_bytes(block)
            written += 1
        except OSError:
            break
    kit.note(f"{directory}: {written} MiB")
    total += written
if total > limit_mb + 4:
    kit.breach(f"{total} MiB written across /tmp, /var/tmp, /dev/shm, /run, home and the working copy "
               f"(disk_mb={limit_mb})")
"""
)

CPU_HOG = (
    PY
    + """\
cpus, seconds, workers = @@LIMIT_CPUS@@, 3.0, 4
started = time.time()
pids = []
for _ in range(workers):
    pid = os.fork()
    if pid == 0:
        end = time.time() + seconds
        while time.time() < end:
            pass
        os._exit(0)
    pids.append(pid)
for pid in pids:
    os.waitpid(pid, 0)
wall, used = time.time() - started, os.times().children_user + os.times().children_system
kit.note(f"{used:.1f} CPU seconds in {wall:.1f} s with cpus={cpus}")
if used > cpus * wall * 1.5:
    kit.breach(f"{used:.1f} CPU seconds in {wall:.1f} s wall: over cpus={cpus}")
"""
)

DESCRIPTORS = (
    PY
    + """\
limit, opened = @@LIMIT_OPEN_FILES@@, []
for _ in range(4 * limit):
    try:
        opened.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        break
kit.note(f"{len(opened)} descriptors (limit {limit})")
if len(opened) > limit:
    kit.breach(f"{len(opened)} open descriptors, over open_files={limit}")
"""
)

CLEANUP_SABOTAGE = (
    PY
    + """\
os.mkdir("deep")
os.chdir("deep")
depth = 0
for _ in range(2500):
    try:
        os.mkdir("d")
        os.chdir("d")
        depth += 1
    except OSError:
        break
Path("bottom.txt").write_text("x")
os.chdir(os.environ["PWD"])
kit.note(f"nested {depth} directories")
Path("locked/inner").mkdir(parents=True)
Path("locked/inner/file").write_text("x")
os.chmod("locked/inner", 0)
os.chmod("locked", 0o100)
Path("weird").mkdir()
for name in ("new\\nline", "tab\\tname", "-rf", "*", "..."):
    Path("weird", name).write_text("x")
with open(b"weird/\\xff\\xfe-invalid-utf8", "w") as handle:
    handle.write("x")
os.mkfifo("weird/fifo")
os.symlink("/", "weird/root-link")
for i in range(1000):
    os.link("weird/-rf", f"weird/hardlink-{i}")
os.chmod("weird", 0o500)
"""
)

KERNEL_MOUNTS = (
    PY
    + """\
import ctypes
kit.expect_denied("mount tmpfs", "mount", b"none", b"/tmp", b"tmpfs", 0, None)
kit.expect_denied("bind mount /", "mount", b"/", b"/tmp", None, 4096, None)
for hidden in ("@@TASKS@@", "@@SUITE@@", "@@RUNTIME_ROOT@@", "/tmp", "/root"):
    kit.expect_denied(f"umount {hidden}", "umount2", hidden.encode(), 2)
kit.expect_denied("chroot", "chroot", b"/tmp")
kit.expect_denied("pivot_root", "pivot_root", b"/tmp", b"/tmp")
"""
)

KERNEL_NAMESPACES = (
    PY
    + """\
import errno
CLONE = {"user": 0x10000000, "mount": 0x00020000, "net": 0x40000000, "pid": 0x20000000, "uts": 0x04000000,
         "ipc": 0x08000000, "cgroup": 0x02000000}
for name, flag in CLONE.items():
    if name != "user":
        kit.in_child(lambda flag=flag, name=name: kit.expect_denied(f"unshare {name}", "unshare", flag))


def peel():
    result = kit.expect_denied("unshare user+mount", "unshare", CLONE["user"] | CLONE["mount"])
    if result < 0:
        return 0
    uid = os.getuid()
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {uid} 1")):
        try:
            Path(f"/proc/self/{name}").write_text(text)
        except OSError as exc:
            kit.note(f"{name}: {exc}")
    for hidden in ("@@TASKS@@", "@@SUITE@@", "@@RUNTIME_ROOT@@", "/tmp", "/root"):
        result, err = kit.syscall("umount2", hidden.encode(), 2)
        if result == 0:
            kit.breach(f"unmounted the mask over {hidden}: {sorted(os.listdir(hidden))[:20]}")
    result, _ = kit.syscall("mount", b"none", b"/mnt", b"tmpfs", 0, None)
    if result == 0:
        kit.breach("mounted a tmpfs inside a new user namespace")
    return 0


kit.in_child(peel)
result = subprocess.run(["unshare", "-Ur", "id", "-u"], capture_output=True, text=True)
if result.returncode == 0:
    kit.breach(f"unshare -Ur works: uid {result.stdout.strip()} in a new user namespace")
for ns in ("net", "mnt", "pid", "user", "ipc", "uts"):
    try:
        fd = os.open(f"/proc/1/ns/{ns}", os.O_RDONLY)
        kit.expect_denied(f"setns {ns} of pid 1", "setns", fd, 0, also=frozenset({errno.EINVAL}))
        os.close(fd)
    except OSError as exc:
        kit.note(f"/proc/1/ns/{ns}: {exc}")
"""
)

KERNEL_PTRACE = (
    PY
    + """\
import ctypes
PTRACE_ATTACH, PTRACE_DETACH, PTRACE_TRACEME = 16, 17, 0
target = os.fork()
if target == 0:
    time.sleep(20)
    os._exit(0)


def attach_sibling():
    result = kit.expect_denied("ptrace attach to a sibling", "ptrace", PTRACE_ATTACH, target, 0, 0)
    if result >= 0:
        kit.syscall("ptrace", PTRACE_DETACH, target, 0, 0)
    parent = os.getppid()
    result = kit.expect_denied("ptrace attach to the harness", "ptrace", PTRACE_ATTACH, parent, 0, 0)
    if result >= 0:
        kit.syscall("ptrace", PTRACE_DETACH, parent, 0, 0)
    buffer = ctypes.create_string_buffer(64)

    class IoVec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

    local = IoVec(ctypes.cast(buffer, ctypes.c_void_p), 64)
    remote = IoVec(0x400000, 64)
    kit.expect_denied("process_vm_readv of a sibling", "process_vm_readv", target, ctypes.byref(local), 1,
                      ctypes.byref(remote), 1, 0)
    return 0


kit.in_child(attach_sibling)
os.kill(target, 9)
os.waitpid(target, 0)
"""
)

KERNEL_KEYRINGS = (
    PY
    + """\
import ctypes
KEY_SPEC_SESSION, KEY_SPEC_USER, KEYCTL_READ = -3, -4, 11
for label, ring in (("session", KEY_SPEC_SESSION), ("user", KEY_SPEC_USER)):
    kit.expect_denied(f"add_key to the {label} keyring", "add_key", b"user", b"orchard-redteam", b"left-behind", 11,
                      ring)
    buffer = ctypes.create_string_buffer(4096)
    result, err = kit.syscall("keyctl", KEYCTL_READ, ring, buffer, 4096)
    kit.note(f"keyctl read {label}: {result}")
"""
)

KERNEL_SURFACE = (
    PY
    + """\
import ctypes
attr = ctypes.create_string_buffer(128)
ctypes.memmove(attr, (1).to_bytes(4, "little") + (4).to_bytes(4, "little") * 2 + (16).to_bytes(4, "little"), 16)
kit.expect_denied("bpf map create", "bpf", 0, attr, 72)
perf = ctypes.create_string_buffer(128)
ctypes.memmove(perf, (1).to_bytes(4, "little") + (128).to_bytes(4, "little"), 8)
kit.expect_denied("perf_event_open", "perf_event_open", perf, 0, -1, -1, 0)
kit.expect_denied("userfaultfd", "userfaultfd", 1)
params = ctypes.create_string_buffer(120)
kit.expect_denied("io_uring_setup", "io_uring_setup", 4, params)
kit.expect_denied("kexec_load", "kexec_load", 0, 0, None, 0)
kit.expect_denied("init_module", "init_module", None, 0, b"")
kit.expect_denied("finit_module", "finit_module", 0, b"", 0)
kit.expect_denied("open_by_handle_at", "open_by_handle_at", -100, attr, 0)
kit.expect_denied("mknod /dev/mem", "mknodat", -100, b"mem-device", 0o20600, (1 << 8) | 1)
kit.expect_denied("swapon", "swapon", b"/tmp/swap", 0)
"""
)

PRIVILEGE = r"""
grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs|Seccomp)' /proc/self/status
eff=$(awk '/^CapEff/ {print $2}' /proc/self/status)
[ "$eff" != "0000000000000000" ] && echo "BREACH: effective capabilities $eff"
for cmd in "sudo -n id -u" "su -c 'id -u' root" "pkexec id -u" "doas id -u"; do
  out=$(sh -c "$cmd" </dev/null 2>/dev/null); [ "$out" = 0 ] && echo "BREACH: $cmd gave root"
done
find / -xdev -perm -4000 -type f 2>/dev/null | head -20 | sed 's/^/NOTE: setuid program /'
python3 - <<'EOF'
import fcntl, termios
for fd in (0, 1, 2):
    try:
        fcntl.ioctl(fd, termios.TIOCSTI, b"x")
        print(f"BREACH: TIOCSTI injected a keystroke on fd {fd}")
    except OSError as exc:
        print(f"NOTE: TIOCSTI fd {fd}: {exc}")
EOF
"""

INHERITED_FDS = r"""
for p in self $PPID 1; do
  for fd in /proc/$p/fd/*; do
    target=$(readlink "$fd" 2>/dev/null) || continue
    echo "NOTE: pid $p fd ${fd##*/} -> $target"
    case "$target" in
      pipe:*|/dev/null|anon_inode:*) ;;
      mnt:\[*|net:\[*|uts:\[*|ipc:\[*|user:\[*|pid:\[*|cgroup:\[*|time:\[*) ;;
      "$PWD"*|"$HOME"*|/tmp/*) ;;
      *) echo "BREACH: pid $p holds fd ${fd##*/} on host object $target" ;;
    esac
  done
done
"""

WRITE_HOST = (
    PY
    + """\
own = [os.getcwd(), str(Path.home()), "/tmp", "/var/tmp", "/dev/shm", "/run", "/proc", "/sys", "/dev"]
deadline, tried = time.time() + 8, 0
stack = [("/", 0)]
while stack and time.time() < deadline:
    directory, depth = stack.pop()
    if any(directory == o or directory.startswith(o.rstrip("/") + "/") for o in own):
        continue
    if os.access(directory, os.W_OK):
        tried += 1
        kit.try_write(os.path.join(directory, f".orchard-redteam-{os.getpid()}"))
    if depth < 4:
        try:
            stack.extend((e.path, depth + 1) for e in os.scandir(directory) if e.is_dir(follow_symlinks=False))
        except OSError:
            pass
for target in ("@@REPO@@/redteam.txt", "@@REPO@@/.venv/redteam.txt", "@@CANARY_LIB@@/redteam.txt", "/etc/redteam"):
    kit.try_write(target)
kit.note(f"{tried} writable host directories found")
"""
)

SYSTEM_ATTACKS: list[Attack] = [
    Attack("fork-bomb", "resources", "lookup", FORK_BOMB, lang="py", doc="3x the process limit"),
    Attack(
        "memory-hog",
        "resources",
        "lookup",
        MEMORY_HOG,
        lang="py",
        timeout_s=40,
        doc="processes each holding 160 MiB, up to twice memory_mb",
    ),
    Attack(
        "disk-filler",
        "resources",
        "lookup",
        DISK_FILLER,
        lang="py",
        timeout_s=40,
        doc="1 MiB files in the working copy up to 4x disk_mb, then 20,000 empty files",
    ),
    Attack(
        "tmp-filler",
        "resources",
        "lookup",
        TMP_FILLER,
        lang="py",
        timeout_s=40,
        doc="2x disk_mb into each of /tmp, /var/tmp, /dev/shm, /run, home, working copy",
    ),
    Attack("cpu-hog", "resources", "lookup", CPU_HOG, lang="py", doc="4 busy processes for 3 s"),
    Attack("descriptor-exhaustion", "resources", "lookup", DESCRIPTORS, lang="py", doc="4x open_files"),
    Attack(
        "cleanup-sabotage",
        "host",
        "lookup",
        CLEANUP_SABOTAGE,
        lang="py",
        doc="2,500 nested dirs, unreadable dirs, odd names, FIFOs, 1,000 hard links: the host must still clean",
    ),
    Attack(
        "mount-and-chroot",
        "kernel",
        "lookup",
        KERNEL_MOUNTS,
        lang="py",
        doc="mount, bind mount, umount the masks, chroot, pivot_root",
    ),
    Attack(
        "namespaces",
        "kernel",
        "lookup",
        KERNEL_NAMESPACES,
        lang="py",
        doc="unshare -U (then peel the masks), other namespaces, setns into pid 1's",
    ),
    Attack(
        "ptrace",
        "kernel",
        "lookup",
        KERNEL_PTRACE,
        lang="py",
        doc="PTRACE_ATTACH to a sibling and to the harness, process_vm_readv",
    ),
    Attack(
        "keyrings",
        "kernel",
        "lookup",
        KERNEL_KEYRINGS,
        lang="py",
        doc="add_key to the session and user keyrings (they outlive the sandbox)",
    ),
    Attack(
        "kernel-attack-surface",
        "kernel",
        "lookup",
        KERNEL_SURFACE,
        lang="py",
        doc="bpf, perf_event_open, userfaultfd, io_uring, kexec, modules, open_by_handle_at, mknod, swapon",
    ),
    Attack(
        "privilege-escalation",
        "kernel",
        "lookup",
        PRIVILEGE,
        doc="capabilities, sudo/su/pkexec, setuid programs, TIOCSTI",
    ),
    Attack(
        "inherited-descriptors",
        "host",
        "lookup",
        INHERITED_FDS,
        doc="descriptors of the harness and its parents that point outside the sandbox",
    ),
    Attack(
        "write-host-paths",
        "host",
        "lookup",
        WRITE_HOST,
        lang="py",
        doc="every writable directory of the host's filesystem, the checkout, the venv",
    ),
]
