"""The local runtime against the real kernel: namespaces, uids, rlimits, confinement, network, events, TTLs.

Every test runs real processes; sandboxes live under ``tmp_path``. The machine's strongest isolation is used (``root``
on the test machines); tests of guarantees only that mode gives say so and are skipped elsewhere.
"""

from __future__ import annotations

import errno
import hashlib
import http.server
import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchard.bus.embedded import EmbeddedBus
from orchard.codec import Codec
from orchard.config import EmbeddedBusConfig
from orchard.sandbox import FileEntry, Limits, SandboxSpec
from orchard.sandbox.exceptions import (
    InvalidSandboxRequestError,
    PathEscapeError,
    SandboxExistsError,
    SandboxFileNotFoundError,
    SandboxNotFoundError,
)
from orchard.sandbox.local.isolation import detect_isolation
from orchard.sandbox.local.runtime import LocalRuntime, LocalSandbox
from orchard.sandbox.local.uids import kill_processes_of
from orchard.topics import SANDBOX_EVENTS

ISOLATION = detect_isolation("auto")
needs_root_mode = pytest.mark.skipif(ISOLATION.mode != "root", reason="needs the 'root' isolation mode")
PYTHON = "/usr/bin/python3"
needs_python = pytest.mark.skipif(not os.access(PYTHON, os.X_OK), reason="needs the system python3")


def shared_under_tmp(sandbox: LocalSandbox) -> list[str]:
    """What a sandbox's own /tmp shows besides its files: the way to shared directories under the host's /tmp (a
    checkout's virtualenv there, as in CI's clone)."""
    shared = sandbox._runtime.shared
    return sorted({p.relative_to("/tmp").parts[0] for p in shared if p.is_relative_to("/tmp")})  # noqa: S108


def spec(sandbox_id: str, **fields: object) -> SandboxSpec:
    """A spec with test identities."""
    return SandboxSpec(sandbox_id=sandbox_id, run_id="run-1", episode_id=f"ep-{sandbox_id}", task_id="task", **fields)


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """A task directory with a git history whose last commit is a 'future' fix, and a nested gitlink file."""
    src = tmp_path / "task"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (src / "README").write_text("task\n")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "GIT_CONFIG_GLOBAL": "/dev/null"}
    identity = ["-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q"], ["add", "-A"], [*identity, "commit", "-qm", "initial"]):
        subprocess.run(["git", *args], cwd=src, env=env, check=True)
    (src / "pkg" / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    subprocess.run(["git", *identity, "commit", "-qam", "FUTURE-FIX"], cwd=src, env=env, check=True)
    subprocess.run(["git", "checkout", "-q", "HEAD~1"], cwd=src, env=env, check=True)
    (src / "vendored").mkdir()
    (src / "vendored" / ".git").write_text("gitdir: /somewhere/else\n")
    return src


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[LocalRuntime]:
    """A runtime under ``tmp_path``, closed (every sandbox deleted) after the test."""
    rt = LocalRuntime(tmp_path / "sandboxes")
    try:
        yield rt
    finally:
        rt.close()


@pytest.fixture
def sandbox(runtime: LocalRuntime, source: Path) -> LocalSandbox:
    """One sandbox with the task's files."""
    return runtime.create(spec("sb-main", source_dir=source))


PF_EXITING = 0x4
"""The kernel's flag of a process being torn down (``/proc/<pid>/stat`` field 9): a sandbox's PID namespace is
killed when its PID 1 exits, and on a busy machine its last processes may still be exiting, never to run again."""


def processes_of(uid: int) -> list[int]:
    """Host pids of live processes owned by ``uid`` (not zombies, not exiting)."""
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                owned = entry.stat().st_uid == uid
                fields = Path(f"/proc/{entry.name}/stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            if owned and fields[0] != "Z" and not int(fields[6]) & PF_EXITING:
                pids.append(int(entry.name))
    return pids


def sandbox_uid(sandbox: LocalSandbox) -> int:
    """The uid the sandbox's commands run as."""
    return int(sandbox.exec(["id", "-u"]).stdout)


# -- commands -------------------------------------------------------------------------------------------------------


def test_exec_reports_exit_status_output_and_takes_stdin_env_cwd(sandbox: LocalSandbox) -> None:
    ok = sandbox.exec("echo out; echo err >&2; exit 3")
    assert (ok.exit_code, ok.stdout, ok.stderr, ok.timed_out) == (3, "out\n", "err\n", False)
    assert sandbox.exec(["cat"], stdin=b"fed\n").stdout == "fed\n"
    assert sandbox.exec("echo $GREETING", env={"GREETING": "hello"}).stdout == "hello\n"
    assert sandbox.exec(["pwd"], cwd="pkg").stdout == f"{sandbox.info().workdir}/pkg\n"
    killed = sandbox.exec("kill -9 $$")
    assert killed.exit_code == 137  # 128 + SIGKILL, as a shell reports it
    assert sandbox.exec(["/no/such/program"]).exit_code == 127


def test_cwd_outside_the_working_copy_is_refused(sandbox: LocalSandbox) -> None:
    with pytest.raises(PathEscapeError):
        sandbox.exec(["pwd"], cwd="../..")
    with pytest.raises(SandboxFileNotFoundError):
        sandbox.exec(["pwd"], cwd="missing")


def test_timeout_kills_the_whole_tree_including_daemonised_grandchildren(sandbox: LocalSandbox) -> None:
    started = time.monotonic()
    result = sandbox.exec("setsid sh -c 'sleep 1000' & (sleep 1000 &); echo started; sleep 1000", timeout_s=1.0)
    assert (result.exit_code, result.timed_out, result.stdout) == (None, True, "started\n")
    assert time.monotonic() - started < 5
    if ISOLATION.drop_uid:
        assert processes_of(sandbox_uid(sandbox)) == []


@needs_root_mode
def test_background_processes_do_not_outlive_their_exec(sandbox: LocalSandbox) -> None:
    uid = sandbox_uid(sandbox)
    result = sandbox.exec("sleep 1000 & setsid sleep 1000 & echo launched")
    assert (result.exit_code, result.stdout) == (0, "launched\n")
    assert processes_of(uid) == []


def test_exec_stream_yields_chunks_then_exit_and_closing_it_kills_the_command(sandbox: LocalSandbox) -> None:
    items = list(sandbox.exec_stream("echo one; sleep 0.1; echo two >&2; exit 4"))
    assert items == [("stdout", b"one\n"), ("stderr", b"two\n"), ("exit", 4)]
    assert list(sandbox.exec_stream("sleep 100", timeout_s=0.5)) == [("exit", None)]
    stream = sandbox.exec_stream("echo ready; sleep 1000")
    assert next(stream) == ("stdout", b"ready\n")
    stream.close()
    if ISOLATION.drop_uid:
        assert processes_of(sandbox_uid(sandbox)) == []


def test_output_beyond_the_cap_is_cut_and_says_so(tmp_path: Path) -> None:
    rt = LocalRuntime(tmp_path / "sandboxes", max_output_bytes=1000)
    try:
        result = rt.create(spec("capped")).exec("head -c 5000 /dev/zero | tr '\\0' x")
    finally:
        rt.close()
    assert result.stdout == "x" * 1000 + "\n[orchard: output truncated at 1000 bytes]"


# -- limits ---------------------------------------------------------------------------------------------------------


@needs_python
def test_memory_limit_makes_a_memory_hog_fail(runtime: LocalRuntime) -> None:
    box = runtime.create(spec("memory", limits=Limits(memory_mb=200)))
    result = box.exec([PYTHON, "-c", "b = bytearray(400 * 1024 * 1024)"])
    if runtime.cgroups.version is not None:  # the sandbox's cgroup: the kernel's OOM killer ends the hog
        assert result.exit_code == 128 + 9
    else:  # the address-space rlimit: the allocation fails
        assert (result.exit_code, "MemoryError" in result.stderr) == (1, True)
    assert box.exec([PYTHON, "-c", "b = bytearray(20 * 1024 * 1024)"]).exit_code == 0


@needs_root_mode
@needs_python
def test_memory_limit_is_for_the_whole_sandbox_not_each_process(runtime: LocalRuntime) -> None:
    box = runtime.create(spec("memory-all", limits=Limits(memory_mb=300)))
    hog = f"{PYTHON} -c 'import time; b = b\"x\" * (120 * 1024 * 1024); time.sleep(3)'"  # touched, not lazy
    result = box.exec(f"{hog} & {hog} & {hog} & wait; echo done", timeout_s=30)
    assert result.stdout == "done\n"
    assert "Killed" in result.stderr or result.exit_code == 0  # at least one of three 120 MiB hogs was killed
    peak = box.exec(f"{hog} & {hog} & wait; echo pair")  # two fit in 300 MiB
    assert peak.stdout == "pair\n" and "Killed" not in peak.stderr


@needs_root_mode
def test_process_limit_is_for_the_whole_sandbox(runtime: LocalRuntime) -> None:
    box = runtime.create(spec("pids", limits=Limits(processes=12)))
    result = box.exec("for i in $(seq 40); do sleep 5 & done; wait", timeout_s=30)
    assert "Cannot fork" in result.stderr or "Resource temporarily unavailable" in result.stderr
    assert box.exec("echo fine").stdout == "fine\n"


def test_cpu_seconds_limit_counts_every_process_of_the_sandbox(runtime: LocalRuntime) -> None:
    if runtime.cgroups.version is None:
        pytest.skip("needs cgroups")
    box = runtime.create(spec("cpu-all", limits=Limits(cpu_seconds=2, cpus=2.0)))
    spin = "sh -c 'while :; do :; done'"
    started = time.monotonic()
    result = box.exec(f"{spin} & {spin} & {spin} & wait", timeout_s=60)  # each alone stays under 2 s a while
    assert "cpu_seconds limit reached" in result.stderr
    assert time.monotonic() - started < 20


def test_disk_limit_is_enforced_while_commands_run(runtime: LocalRuntime) -> None:
    box = runtime.create(spec("disk", limits=Limits(disk_mb=32, file_size_mb=8)))
    fill = "i=0; while :; do i=$((i+1)); head -c 4000000 /dev/zero > {dir}/f$i || exit 9; done"
    for directory in (".", "/tmp", "$HOME"):  # the working copy, the temporary files and home share the limit
        result = box.exec(fill.format(dir=directory), timeout_s=60)
        if runtime.scratch:  # a tmpfs of disk_mb: the kernel refuses the write
            assert (result.exit_code, "No space left on device" in result.stderr) == (9, True)
        else:
            assert "disk_mb limit reached" in result.stderr
        box.exec(f"rm -f {directory}/f*")
    used = sum(p.stat().st_size for p in box.workdir.iterdir())
    assert used == 0


def test_a_million_empty_files_stop_the_sandbox(runtime: LocalRuntime) -> None:
    from orchard.sandbox.local import mounts, watchdog

    original = watchdog.MAX_ENTRIES, mounts.MAX_INODES
    watchdog.MAX_ENTRIES = mounts.MAX_INODES = 2000
    try:
        box = runtime.create(spec("inodes"))
        result = box.exec("mkdir d; cd d; i=0; while :; do i=$((i+1)); : > f$i || exit 9; done", timeout_s=60)
    finally:
        watchdog.MAX_ENTRIES, mounts.MAX_INODES = original
    if runtime.scratch:
        assert (result.exit_code != 0, "No space left on device" in result.stderr) == (True, True)
    else:
        assert "more than 2000 files" in result.stderr


def test_file_size_limit_stops_a_write_at_the_limit(runtime: LocalRuntime) -> None:
    box = runtime.create(spec("fsize", limits=Limits(file_size_mb=1)))
    result = box.exec("head -c 3000000 /dev/zero > big")
    assert result.exit_code == 128 + 25  # SIGXFSZ
    assert box.list_files("big") == [FileEntry(path="big", kind="file", size=1024 * 1024)]


def test_cpu_limit_kills_a_spinning_process(runtime: LocalRuntime) -> None:
    box = runtime.create(spec("cpu", limits=Limits(cpu_seconds=1)))
    result = box.exec("while :; do :; done", timeout_s=20)
    assert result.exit_code in (128 + 24, 128 + 9)  # SIGXCPU at the soft limit, SIGKILL at the hard one
    assert result.duration_ms < 10_000


@needs_python
def test_open_files_limit(runtime: LocalRuntime) -> None:
    box = runtime.create(spec("nofile", limits=Limits(open_files=16)))
    result = box.exec([PYTHON, "-c", "fs = [open('/dev/null') for _ in range(64)]"])
    assert result.exit_code == 1
    assert "Too many open files" in result.stderr


@needs_root_mode
def test_process_limit_counts_the_sandbox_processes(runtime: LocalRuntime) -> None:
    box = runtime.create(spec("nproc", limits=Limits(processes=8)))
    result = box.exec("for i in 1 2 3 4 5 6 7 8 9 10 11 12; do sleep 5 & done; echo done")
    assert (result.exit_code, result.stdout, result.stderr) == (2, "", "/bin/sh: 0: Cannot fork\n")
    assert box.exec("echo fine").stdout == "fine\n"  # the processes of the failed exec are gone


# -- confinement ----------------------------------------------------------------------------------------------------


def test_working_copy_has_no_git_history(sandbox: LocalSandbox, source: Path) -> None:
    assert (source / ".git").is_dir()
    listing = sandbox.exec("find . | sort").stdout.split()
    assert listing == [".", "./README", "./pkg", "./pkg/calc.py", "./vendored"]
    assert sandbox.read_file("pkg/calc.py") == b"def add(a, b):\n    return a - b\n"
    assert "FUTURE-FIX" not in sandbox.exec("git log --all 2>&1; cat -v .git/* 2>&1").stdout


def test_git_snapshot_is_a_one_commit_repository(tmp_path: Path, source: Path) -> None:
    rt = LocalRuntime(tmp_path / "sandboxes", git_snapshot=True)
    try:
        box = rt.create(spec("snap", source_dir=source))
        log = box.exec("git log --all --format=%s").stdout
        box.write_file("pkg/calc.py", b"changed\n")
        diff = box.exec("git status --porcelain").stdout
    finally:
        rt.close()
    assert (log, diff) == ("task\n", " M pkg/calc.py\n")


def test_a_sandbox_spec_asking_for_a_git_snapshot_gets_one_from_a_runtime_without_the_default(
    runtime: LocalRuntime, source: Path
) -> None:
    snap = runtime.create(spec("asked", source_dir=source, git_snapshot=True))
    plain = runtime.create(spec("default", source_dir=source))
    assert snap.exec("git log --all --format=%s").stdout == "task\n"
    assert not (plain.workdir / ".git").exists()


def test_one_sandbox_cannot_see_another(runtime: LocalRuntime) -> None:
    first, second = runtime.create(spec("first")), runtime.create(spec("second"))
    first.write_file("secret.txt", b"first's secret")
    peek = second.exec(f"cat {first.workdir}/secret.txt; ls {runtime.root}; cd ../..; pwd")
    assert "first's secret" not in peek.stdout
    if ISOLATION.namespaces:  # no host path of the runtime exists inside: the working copy is /sandbox/work
        assert peek.stdout == "/\n"
        assert f"cat: {first.workdir}/secret.txt: No such file or directory" in peek.stderr
        assert f"ls: cannot access '{runtime.root}': No such file or directory" in peek.stderr
    else:  # own uids and mode 0700 directories
        assert "Permission denied" in peek.stderr
    with pytest.raises(PathEscapeError):
        second.read_file("../../first/work/secret.txt")
    second.exec(f"ln -s {first.workdir}/secret.txt abs-link; ln -s ../../first/work/secret.txt rel-link")
    for link in ("abs-link", "rel-link"):
        with pytest.raises(PathEscapeError):
            second.read_file(link)
        with pytest.raises(PathEscapeError):
            second.write_file(link, b"overwrite")
    assert first.read_file("secret.txt") == b"first's secret"


def test_file_api_confines_paths_and_follows_links_that_stay_inside(sandbox: LocalSandbox) -> None:
    sandbox.write_file("new/dir/file.txt", b"data", mode=0o600)
    assert sandbox.read_file("new/./dir/../dir/file.txt") == b"data"
    assert sandbox.exec("stat -c %a new/dir/file.txt").stdout == "600\n"
    sandbox.exec("ln -s pkg/calc.py inner; ln -s /etc/passwd outer; ln -s ../../../../../../etc/passwd up")
    assert sandbox.read_file("inner").startswith(b"def add")
    for path in ("/etc/passwd", "../../etc/passwd", "outer", "up", "pkg/../../x"):
        with pytest.raises(PathEscapeError):
            sandbox.read_file(path)
    with pytest.raises(SandboxFileNotFoundError):
        sandbox.read_file("missing.txt")
    with pytest.raises(InvalidSandboxRequestError):
        sandbox.read_file("pkg")
    with pytest.raises(InvalidSandboxRequestError):
        sandbox.delete_file(".")
    sandbox.delete_file("outer")
    assert os.path.exists("/etc/passwd")
    sandbox.delete_file("new")
    listing = sandbox.list_files(".", recursive=True)
    assert [e.path for e in listing] == ["README", "inner", "pkg", "pkg/calc.py", "up", "vendored"]
    assert sandbox.list_files("pkg") == [FileEntry(path="pkg/calc.py", kind="file", size=32)]


@needs_root_mode
def test_a_hard_link_to_a_host_file_is_not_readable_through_the_file_api(sandbox: LocalSandbox) -> None:
    outside = sandbox.directory.parent.parent / "host-secret"
    outside.write_text("host secret")
    try:
        os.link(outside, sandbox.workdir / "planted")  # as if the sandbox could link it (the kernel forbids that)
    except OSError as exc:  # the working copy is a tmpfs of its own: no link from the host can exist
        assert exc.errno == errno.EXDEV
        return
    with pytest.raises(PathEscapeError):
        sandbox.read_file("planted")
    sandbox.write_file("planted", b"replaced")  # replaces the link, never writes through it
    assert outside.read_text() == "host secret"


@pytest.fixture
def world_readable_data() -> Iterator[Path]:
    """A world-readable data directory outside the paths every sandbox gets privately (/tmp, /run, ...): under the
    checkout's .orchard, where the embedded bus and store live by default."""
    home = Path(__file__).resolve().parents[3] / ".orchard"
    home.mkdir(exist_ok=True)
    data = Path(tempfile.mkdtemp(prefix="test-env-hidden-", dir=home))
    data.chmod(0o755)
    (data / "bus").mkdir()
    (data / "bus" / "model-calls.log").write_text("other episodes' model calls")
    (data / "bus" / "model-calls.log").chmod(0o644)
    try:
        yield data
    finally:
        shutil.rmtree(data, ignore_errors=True)


@needs_root_mode
def test_nothing_of_the_host_exists_inside_but_the_allow_list(world_readable_data: Path) -> None:
    data = world_readable_data
    rt = LocalRuntime(data / "sandboxes")
    try:
        box = rt.create(spec("allow-list"))
        peek = box.exec(f"ls -A {data}; cat {data}/bus/model-calls.log; pwd")
        top = box.exec("ls -A /").stdout.split()
        etc = box.exec("ls -A /etc").stdout.split()
        missing = box.exec("ls -A /home /srv /root/.ssh /var/lib 2>&1").stdout
    finally:
        rt.close()
    assert "other episodes' model calls" not in peek.stdout
    assert f"ls: cannot access '{data}': No such file or directory" in peek.stderr
    assert peek.stdout == "/sandbox/work\n"
    way_to_shared = {p.parts[1] for p in rt.shared}  # a checkout elsewhere (CI clones under /check) shows its top
    assert set(top) <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "run", "sandbox", "sbin",
                        "tmp", "usr", "var", "root", "work", "opt"} | way_to_shared  # fmt: skip
    assert "shadow" not in etc and "ssh" not in etc and "passwd" in etc  # only what programs need
    assert missing.count("No such file or directory") == 4, missing


def test_a_shared_path_that_would_show_a_hidden_one_is_refused(tmp_path: Path) -> None:
    (tmp_path / "data" / "bus").mkdir(parents=True)
    with pytest.raises(ValueError, match="would show"):
        LocalRuntime(tmp_path / "rt", hidden_paths=[tmp_path / "data" / "bus"], shared_paths=[tmp_path / "data"])
    with pytest.raises(ValueError, match="would show"):
        LocalRuntime(tmp_path / "shared" / "rt", shared_paths=[tmp_path / "shared"])


def test_host_environment_and_secrets_are_not_visible(runtime: LocalRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCHARD_STORE__SECRET_KEY", "s3cr3t-value")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-s3cr3t")
    box = runtime.create(spec("env", env={"TASK_VAR": "visible"}))
    env = dict(line.split("=", 1) for line in box.exec(["env"]).stdout.splitlines())
    expected = {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "TERM", "TMPDIR", "PWD", "GIT_CEILING_DIRECTORIES"}
    assert set(env) == expected | {"TASK_VAR"}
    assert env["HOME"] == box.inside_home
    everything = box.exec("cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'").stdout
    assert "s3cr3t" not in everything
    if ISOLATION.drop_uid:  # /root is unreadable, or (masked) shows only the shared interpreter's directory in it
        listing = box.exec("ls -A /root")
        shared_there = {p.relative_to("/root").parts[0] for p in runtime.shared if p.is_relative_to("/root")}
        assert listing.exit_code != 0 or set(listing.stdout.split()) <= shared_there


@needs_root_mode
def test_commands_run_unprivileged_in_their_own_namespaces(sandbox: LocalSandbox) -> None:
    status = sandbox.exec("grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/self/status").stdout.split()
    assert status == ["CapEff:", "0000000000000000", "CapBnd:", "0000000000000000", "NoNewPrivs:", "1"]
    assert sandbox.exec("ps -e -o pid= | wc -l").stdout.strip() in ("4", "5")  # init, wrapper, sh, ps (+ wc)
    with tempfile.NamedTemporaryFile(dir="/tmp", prefix="host-only-") as host_file:  # noqa: S108 - the host's /tmp
        seen = sandbox.exec(f"ls {host_file.name}; echo private > /tmp/mine").stderr
        assert "No such file or directory" in seen
    assert sandbox.exec("cat /tmp/mine").stdout == "private\n"  # /tmp lives as long as the sandbox
    assert not Path("/tmp/mine").exists()  # noqa: S108
    assert sandbox.exec(["mount", "-t", "tmpfs", "x", "/mnt"]).exit_code != 0
    assert sandbox.exec("ls -A /dev/shm").stdout == ""
    assert sandbox.exec("ls -A /var/tmp").stdout.split() == sorted(["mine", *shared_under_tmp(sandbox)])  # is /tmp
    assert sandbox.exec("ls -A /run").stdout == ""
    seccomp = sandbox.exec("grep Seccomp: /proc/self/status").stdout.split()
    assert seccomp == ["Seccomp:", "2"]  # a filter is installed


# -- network --------------------------------------------------------------------------------------------------------


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        body = f"hello from the host: {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's signature
        return


@pytest.fixture
def host_server() -> Iterator[int]:
    """An HTTP server on the host's loopback; yields its port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


FETCH = (
    "import sys, urllib.request\n"
    "try:\n"
    "    print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())\n"
    "except Exception as exc:\n"
    "    print('FAILED', type(exc).__name__, exc)\n"
)


@needs_root_mode
@needs_python
def test_no_network_but_the_proxy(runtime: LocalRuntime, host_server: int) -> None:
    url = f"http://127.0.0.1:{host_server}"
    closed = runtime.create(spec("closed"))
    assert closed.exec([PYTHON, "-c", FETCH, url]).stdout.startswith("FAILED URLError")
    assert closed.exec([PYTHON, "-c", FETCH, "http://10.255.255.1:80"]).stdout.startswith("FAILED URLError")
    assert closed.exec("cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '").stdout == "lo\n"

    proxied = runtime.create(spec("proxied", proxy_url=f"{url}/v1"))
    assert proxied.info().proxy_endpoint == f"http://127.0.0.1:{host_server}/v1"
    fetched = proxied.exec([PYTHON, "-c", FETCH, f"{url}/v1/models"])
    assert fetched.stdout == "hello from the host: /v1/models\n"
    other_port = f"http://127.0.0.1:{host_server + 1 if host_server < 65535 else 1}/"
    assert proxied.exec([PYTHON, "-c", FETCH, other_port]).stdout.startswith("FAILED URLError")


# -- lifetime -------------------------------------------------------------------------------------------------------


def test_ttl_reaping_and_heartbeat(runtime: LocalRuntime) -> None:
    short = runtime.create(spec("short", ttl_s=0.3))
    kept = runtime.create(spec("kept", ttl_s=1.0))
    time.sleep(0.6)
    kept.heartbeat()
    assert runtime.reap_expired() == ["short"]
    time.sleep(0.6)  # past kept's first deadline, not past the one its heartbeat set
    assert runtime.reap_expired() == []
    assert [s.spec.sandbox_id for s in runtime.list()] == ["kept"]
    assert not short.directory.exists()
    with pytest.raises(SandboxNotFoundError):
        runtime.get("short")
    with pytest.raises(SandboxNotFoundError):
        short.exec(["true"])


def test_create_refuses_duplicates_and_delete_cleans_up(runtime: LocalRuntime, tmp_path: Path) -> None:
    box = runtime.create(spec("dup"))
    with pytest.raises(SandboxExistsError):
        runtime.create(spec("dup"))
    with pytest.raises(InvalidSandboxRequestError):
        runtime.create(spec("nosrc", source_dir=tmp_path / "missing"))
    assert not (runtime.root / "nosrc").exists()
    uid = sandbox_uid(box) if ISOLATION.drop_uid else None
    runtime.delete("dup")
    runtime.delete("dup")
    assert not box.directory.exists()
    if uid is not None:
        assert processes_of(uid) == []


def test_allowed_sources_and_disk_limit(tmp_path: Path, source: Path) -> None:
    rt = LocalRuntime(tmp_path / "sandboxes", allowed_sources=[tmp_path / "elsewhere"])
    try:
        with pytest.raises(InvalidSandboxRequestError, match="not under an allowed source"):
            rt.create(spec("outside", source_dir=source))
    finally:
        rt.close()
    big = tmp_path / "big"
    big.mkdir()
    (big / "blob").write_bytes(b"x" * (17 * 1024 * 1024))
    rt = LocalRuntime(tmp_path / "sandboxes2")
    try:
        with pytest.raises(InvalidSandboxRequestError, match="larger than the disk limit"):
            rt.create(spec("big", source_dir=big, limits=Limits(disk_mb=16)))
        assert [p for p in (tmp_path / "sandboxes2").iterdir() if not p.name.startswith(".etc-")] == []
    finally:
        rt.close()


def test_apply_patch(sandbox: LocalSandbox) -> None:
    patch = (
        "--- a/pkg/calc.py\n+++ b/pkg/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n"
    )
    result = sandbox.apply_patch(patch)
    assert result.exit_code == 0, result.stderr
    assert sandbox.read_file("pkg/calc.py") == b"def add(a, b):\n    return a + b\n"
    assert sandbox.apply_patch(patch).exit_code != 0  # no longer applies
    escape = "--- a/../../evil\n+++ b/../../evil\n@@ -0,0 +1 @@\n+pwned\n"
    assert sandbox.apply_patch(escape).exit_code != 0
    assert not (sandbox.directory.parent / "evil").exists()


def test_git_never_finds_a_repository_above_the_sandbox(tmp_path: Path) -> None:
    outer = tmp_path / "outer"
    outer.mkdir()
    subprocess.run(["git", "init", "-q", str(outer)], check=True)
    rt = LocalRuntime(outer / "sandboxes")
    try:
        box = rt.create(spec("nested"))
        found = box.exec("git rev-parse --show-toplevel")
        box.write_file("f.txt", b"a\n")
        patched = box.apply_patch("--- a/f.txt\n+++ b/f.txt\n@@ -1 +1 @@\n-a\n+b\n")
        content = box.read_file("f.txt")
    finally:
        rt.close()
    assert found.exit_code == 128 and "not a git repository" in found.stderr
    assert (patched.exit_code, content) == (0, b"b\n")


def test_pty_runs_an_interactive_shell(sandbox: LocalSandbox) -> None:
    session = sandbox.open_pty(cols=100, rows=30)
    try:
        session.write(b"stty size; echo hi-$((40+2))\n")
        seen = b""
        deadline = time.monotonic() + 10
        while b"hi-42" not in seen and time.monotonic() < deadline:
            seen += session.read(timeout_s=0.5) or b""
        assert b"30 100" in seen
        assert b"hi-42" in seen
        session.write(b"exit 5\n")
        assert session.wait(10) == 5
    finally:
        session.close()


# -- events ---------------------------------------------------------------------------------------------------------


def test_every_operation_is_published_as_a_sandbox_event(tmp_path: Path) -> None:
    bus = EmbeddedBus(EmbeddedBusConfig(path=tmp_path / "bus"))
    bus.create_topic(SANDBOX_EVENTS, partitions=2)
    producer = bus.producer()
    rt = LocalRuntime(tmp_path / "sandboxes", producer)
    try:
        box = rt.create(spec("evented"))
        box.exec("echo hi; echo err >&2")
        box.write_file("f.txt", b"content")
        box.read_file("f.txt")
        box.list_files(".")
        box.apply_patch("--- a/f.txt\n+++ b/f.txt\n@@ -1 +1 @@\n-content\n\\ No newline at end of file\n+new\n")
        box.delete_file("f.txt")
        box.exec("sleep 10", timeout_s=0.2)
    finally:
        rt.close()
        producer.close()
    consumer = bus.consumer([SANDBOX_EVENTS])
    records = []
    while batch := consumer.poll(max_records=100, timeout_s=0.2):
        records.extend(batch)
    codec = Codec.default()
    events = sorted((codec.decode(r.value).record for r in records), key=lambda e: e["sequence"])
    assert {r.key for r in records} == {b"ep-evented"}
    assert [(e["sequence"], e["operation"], e["command_or_path"], e["exit_code"]) for e in events] == [
        (0, "EXEC", "echo hi; echo err >&2", 0),
        (1, "WRITE_FILE", "f.txt", None),
        (2, "READ_FILE", "f.txt", None),
        (3, "LIST_FILES", ".", None),
        (4, "APPLY_PATCH", "git apply --verbose --whitespace=nowarn -", 0),
        (5, "DELETE_FILE", "f.txt", None),
        (6, "EXEC", "sleep 10", None),
    ]
    assert (events[0]["output_sha256"], events[0]["output_bytes"]) == (hashlib.sha256(b"hi\nerr\n").hexdigest(), 7)
    assert events[1]["output_sha256"] == events[2]["output_sha256"] == hashlib.sha256(b"content").hexdigest()
    assert events[6]["output_sha256"] == "" and events[6]["output_bytes"] == 0
    assert all(e["run_id"] == "run-1" and e["sandbox_id"] == "evented" for e in events)
    bus.close()


# -- other isolation modes ------------------------------------------------------------------------------------------


@pytest.fixture
def open_root() -> Iterator[Path]:
    """A runtime root whose parents any uid can traverse (without namespaces the real path is used)."""
    root = Path(tempfile.mkdtemp(prefix="orchard-sandboxes-", dir="/tmp"))  # noqa: S108 - traversable by design
    root.chmod(0o711)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_without_namespaces_commands_still_get_limits_and_a_clean_environment(open_root: Path) -> None:
    rt = LocalRuntime(open_root / "sandboxes", isolation="none")
    try:
        box = rt.create(spec("plain", limits=Limits(file_size_mb=1)))
        assert box.info().isolation is not None and "no namespaces" not in box.info().isolation
        assert box.exec("echo $HOME; echo $TMPDIR").stdout == f"{box.directory}/home\n{box.directory}/tmp\n"
        assert box.exec("head -c 2000000 /dev/zero > f").exit_code == 128 + 25
        result = box.exec("(sleep 1000 &); sleep 1000", timeout_s=0.5)
        assert (result.exit_code, result.timed_out) == (None, True)
        if rt.isolation.drop_uid:
            assert processes_of(sandbox_uid(box)) == []
    finally:
        rt.close()


def test_user_namespace_mode_runs_without_capabilities(open_root: Path) -> None:
    try:
        rt = LocalRuntime(open_root / "sandboxes", isolation="userns")
    except Exception as exc:  # noqa: BLE001 - the kernel may not allow user namespaces
        pytest.skip(f"user namespaces unavailable: {exc}")
    try:
        box = rt.create(spec("userns"))
        status = box.exec("grep -E '^CapEff' /proc/self/status; ps -e -o pid= | wc -l").stdout.split()
        assert status[:2] == ["CapEff:", "0000000000000000"]
        with pytest.raises(InvalidSandboxRequestError, match="proxy_url"):
            rt.create(spec("userns-proxy", proxy_url="http://127.0.0.1:1/v1"))
    finally:
        rt.close()


NON_ROOT_SCRIPT = """
import sys
from pathlib import Path
from orchard.sandbox.local.runtime import LocalRuntime
from orchard.sandbox import SandboxSpec
from orchard.logging import configure_logging
configure_logging("json", "WARNING")
runtime = LocalRuntime(Path(sys.argv[1]))
make = lambda name: runtime.create(SandboxSpec(sandbox_id=name, run_id="r", episode_id=name, task_id="t"))
first, second = make("first"), make("second")
first.write_file("secret.txt", b"first-secret")
print(runtime.isolation.mode)
print(second.exec(f"cat {first.workdir}/secret.txt; grep CapEff /proc/self/status").stdout.strip())
print(second.exec("sleep 100", timeout_s=0.3).timed_out)
runtime.close()
"""


def test_a_non_root_runtime_isolates_through_a_user_namespace(open_root: Path) -> None:
    system_python = Path(PYTHON)
    version = subprocess.run([PYTHON, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True)
    if os.geteuid() != 0 or not system_python.exists() or version.stdout.strip() != str(sys.version_info[:2]):
        pytest.skip("needs root (to become nobody) and a system python of the venv's version")
    repo = Path(__file__).resolve().parents[3]
    path = os.pathsep.join([str(repo), sysconfig.get_paths()["purelib"]])
    os.chown(open_root, 65534, 65534)
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "env", "-i", f"PYTHONPATH={path}"]
    done = subprocess.run(
        [*nobody, "PATH=/usr/bin:/bin", PYTHON, "-c", NON_ROOT_SCRIPT, str(open_root / "sandboxes")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0 and ("Permission denied" in done.stderr or "No module named 'orchard'" in done.stderr):
        pytest.skip(f"the checkout is not readable by nobody: {done.stderr[-300:]}")
    assert done.stdout.splitlines() == ["userns", "CapEff:\t0000000000000000", "True"], done.stderr


def test_uid_leases_evict_stray_processes() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to start a process as another uid")
    uid = 1_899_999_999
    stray = subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "sleep", "1000"])
    try:
        deadline = time.monotonic() + 5
        while stray.pid not in processes_of(uid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert kill_processes_of(uid) == [stray.pid]
        assert stray.wait(5) == -9
    finally:
        stray.kill()
        stray.wait()


@needs_root_mode
def test_shared_paths_are_visible_read_only_even_under_the_private_tmp(tmp_path: Path) -> None:
    # Directly under /tmp (pytest's own tmp_path sits in a 0700 directory the sandbox user cannot traverse);
    # every sandbox otherwise sees /tmp as its own empty tmpfs.
    tools = Path(tempfile.mkdtemp(prefix="orchard-shared-tools-", dir="/tmp"))  # noqa: S108
    tools.chmod(0o755)
    (tools / "harness.sh").write_text("echo harness ran\n")
    (tools / "harness.sh").chmod(0o755)
    shared = LocalRuntime(tmp_path / "rt-shared", shared_paths=[tools])
    plain = LocalRuntime(tmp_path / "rt-plain")
    try:
        box = shared.create(spec("shared"))
        assert box.exec(f"sh {tools}/harness.sh").stdout == "harness ran\n"
        assert box.exec(f"touch {tools}/planted").exit_code != 0
        assert plain.create(spec("plain")).exec(f"test -e {tools}/harness.sh").exit_code == 1
        assert sorted(p.name for p in tools.iterdir()) == ["harness.sh"]
    finally:
        shared.close()
        plain.close()
        shutil.rmtree(tools, ignore_errors=True)


@pytest.fixture
def private_tree() -> Iterator[Path]:
    """``<dir>/`` (mode 0700, like ``/root``) holding ``secret.txt`` and a world-readable ``tools/run.sh``, outside
    the directories every sandbox gets privately, so only a mask makes ``tools`` reachable."""
    home = Path(__file__).resolve().parents[3] / ".orchard"
    home.mkdir(exist_ok=True)
    top = Path(tempfile.mkdtemp(prefix="test-env-private-", dir=home))  # mode 0700
    (top / "secret.txt").write_text("host secret")
    (top / "secret.txt").chmod(0o644)
    (top / "tools" / "bin").mkdir(parents=True)
    for directory in (top / "tools", top / "tools" / "bin"):
        directory.chmod(0o755)
    (top / "tools" / "bin" / "run.sh").write_text("echo tool ran\n")
    (top / "tools" / "bin" / "run.sh").chmod(0o755)
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


@needs_root_mode
def test_a_shared_path_under_an_untraversable_directory_is_reachable_and_nothing_else_there(
    tmp_path: Path, private_tree: Path
) -> None:
    tools = private_tree / "tools"
    control = LocalRuntime(tmp_path / "rt-control", share_interpreter=False)
    rt = LocalRuntime(tmp_path / "rt-masked", shared_paths=[tools], share_interpreter=False)
    try:
        assert control.create(spec("control")).exec(f"sh {tools}/bin/run.sh").exit_code != 0  # 0700 above it
        box = rt.create(spec("masked"))
        assert box.exec(f"sh {tools}/bin/run.sh").stdout == "tool ran\n"
        listing = box.exec(f"ls -A {private_tree}; cat {private_tree}/secret.txt")
        assert listing.stdout.split() == ["tools"]  # only what is shared
        assert "secret.txt: No such file or directory" in listing.stderr
        assert box.exec(f"touch {tools}/planted || touch {private_tree}/planted").exit_code != 0
        assert box.exec(f"ls -A {tools}").stdout.split() == ["bin"]
    finally:
        control.close()
        rt.close()
    assert sorted(p.name for p in private_tree.iterdir()) == ["secret.txt", "tools"]  # the host side is untouched


@needs_root_mode
def test_this_interpreter_runs_orchard_inside_a_sandbox_without_exposing_its_home(tmp_path: Path) -> None:
    rt = LocalRuntime(tmp_path / "sandboxes")
    try:
        box = rt.create(spec("python"))
        probe = "import sys, orchard.harnesses.builtin_agent, httpx; print(sys.prefix)"
        result = box.exec([sys.executable, "-c", probe])
        assert (result.exit_code, result.stdout.strip()) == (0, sys.prefix), result.stderr
        assert box.exec([sys.executable, "-c", "open(__import__('sys').executable, 'ab')"]).exit_code != 0  # read-only
        home = Path.home()
        if not os.stat(home).st_mode & 0o001:  # a private home (/root): nothing of it but the interpreter shows
            others = [p for p in home.iterdir() if not Path(sys.base_prefix).resolve().is_relative_to(p)]
            seen = box.exec(" ".join(f"test -e {shlex.quote(str(p))} && echo {shlex.quote(p.name)};" for p in others))
            assert seen.stdout == "", seen.stdout
    finally:
        rt.close()


# -- grading --------------------------------------------------------------------------------------------------------

GRADER = b"""\
import json, os, sys
out = os.environ["ORCHARD_GRADER_OUT"]
seen = {"answer": open("answer.txt").read() if os.path.exists("answer.txt") else None,
        "tmp": sorted(os.listdir("/tmp")) if os.path.isdir("/tmp") else None,
        "home": sorted(os.listdir(os.environ["HOME"])),
        "path": sys.path, "env": sorted(os.environ)}
open(os.path.join(out, "signals.json"), "w").write(json.dumps({"graded": 1.0}))
open(os.path.join(out, "seen.json"), "w").write(json.dumps(seen))
try:
    open(os.path.join(os.environ["ORCHARD_GRADER_DIR"], "grade.py"), "a")
    print("grader writable")
except OSError:
    pass
"""


def test_the_grader_runs_out_of_the_agents_reach(sandbox: LocalSandbox) -> None:
    sandbox.exec("echo 42 > answer.txt; echo agent > /tmp/agent-file; echo agent > $HOME/agent-file")
    sandbox.exec("mkdir -p .grader; echo 'raise SystemExit(0)' > json.py; cp json.py .grader/json.py")
    sandbox.write_file(".orchard-signals.json", b'{"forged": 1.0}')
    command = 'python3 -I "$ORCHARD_GRADER_DIR/grade.py"'
    run = sandbox.run_grader({"grade.py": GRADER}, command, timeout_s=60)
    assert run.result.exit_code == 0, run.result.stderr
    assert "grader writable" not in run.result.stdout
    assert json.loads(run.outputs["signals.json"]) == {"graded": 1.0}
    seen = json.loads(run.outputs["seen.json"])
    assert seen["answer"] == "42\n"  # the working copy is the grader's input
    if sandbox.info().workdir == "/sandbox/work":  # namespaced: a fresh /tmp and $HOME, nothing of the agent's
        assert (seen["tmp"], seen["home"]) == (shared_under_tmp(sandbox), [])
    assert not any(entry in ("", ".", sandbox.info().workdir) for entry in seen["path"])  # -I: no cwd on sys.path
    assert "ORCHARD_GRADER_DIR" in seen["env"] and not any(name.startswith("PYTHON") for name in seen["env"])
    assert not (sandbox.workdir / ".orchard-signals.json").exists()  # a pre-written verdict is gone


@needs_root_mode
def test_no_agent_process_survives_into_grading(sandbox: LocalSandbox) -> None:
    planted = threading.Thread(  # an agent command still running when grading starts, rewriting the answer
        target=sandbox.exec, args=("while :; do echo forged > answer.txt; sleep 0.01; done",), kwargs={"timeout_s": 60}
    )
    planted.start()
    time.sleep(0.5)
    run = sandbox.run_grader({}, "sleep 0.3; echo honest > answer.txt; sleep 0.3; cat answer.txt", timeout_s=30)
    planted.join(10)
    assert not planted.is_alive()
    assert run.result.stdout == "honest\n"
    assert kill_processes_of(sandbox.resources.owner[0]) == []  # type: ignore[index]


def test_grader_files_cannot_leave_their_directory(sandbox: LocalSandbox) -> None:
    with pytest.raises(InvalidSandboxRequestError):
        sandbox.run_grader({"../escape.py": b"x"}, "true", timeout_s=10)


def test_a_recursive_listing_survives_thousands_of_nested_directories(sandbox: LocalSandbox) -> None:
    made = sandbox.exec("i=0; while [ $i -lt 1500 ]; do mkdir d && cd d || exit 1; i=$((i+1)); done", timeout_s=120)
    assert made.exit_code == 0, made.stderr
    entries = sandbox.list_files(".", recursive=True)
    assert 200 < len(entries) < 1500 and entries[1].path == "d"  # cut at the depth limit, no RecursionError
