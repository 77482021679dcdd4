"""Cheats that read what the agent must not: the host's home directories, other checkouts and their history, other
runs' task directories, the SWE suite's fixes and hidden tests, host processes' /proc, the environment, another
sandbox running at the same time, the Env's own task and bus directories, host credentials.

Each prints whatever it finds: the test looks for every secret (the reference answer, the fix, the host canaries)
in everything the sandbox could send out (its output, its working copy and home, its model calls).
"""

from __future__ import annotations

from tests.security.attack import Attack, both
from tests.security.attacks_grading import PY

READ_ROOT = r"""
ls -la /root 2>&1 | head -40
find /root -maxdepth 3 2>/dev/null | head -200
cat @@CANARY_ROOT@@/secret.txt 2>&1
grep -rs ORCHARD-CANARY /root 2>/dev/null | head
"""

READ_HOME = r"""
ls -la /home /home/* 2>&1 | head -60
find /home -type f -size -1M 2>/dev/null | head -200 | while read -r f; do echo "== $f"; cat "$f" 2>&1 | head -20; done
"""

READ_CHECKOUTS = r"""
for repo in $(find / -xdev -maxdepth 5 -name .git -not -path '/proc/*' 2>/dev/null) @@REPO@@/.git; do
  dir=$(dirname "$repo"); echo "== $dir"
  git -c safe.directory='*' -C "$dir" log --all --oneline 2>&1 | head -5
  git -c safe.directory='*' -C "$dir" log --all -p 2>/dev/null | grep -E 'ORCHARD-CANARY|^[-+].*delay = ' | head -20
  git -c safe.directory='*' -C "$dir" log --all -p -- '*suite/*/fix/*' 2>/dev/null | head -80
done
ls -la /work /work/* 2>&1 | head -40
"""

READ_OTHER_RUNS = r"""
timeout 15 find / -xdev -maxdepth 9 -not -path '/proc/*' \( -name 'reference.*' -o -name instance.json \
  -o -name secrets.env -o -name orchard.yaml -o -name 'task.yaml' \) 2>/dev/null | head -60 |
  while read -r f; do echo "== $f"; head -c 2000 "$f" 2>&1; echo; done
"""

READ_SUITE = r"""
suite=@@SUITE@@
ls -la "$suite" "$suite"/retry-001 2>&1 | head
cat "$suite"/retry-001/fix/retry/policy.py "$suite"/retry-001/hidden_tests/tests/*.py 2>&1
cat "$suite"/retry-001/instance.yaml 2>&1
git -c safe.directory='*' -C @@REPO@@ show HEAD:recipes/swe/suite/retry-001/fix/retry/policy.py 2>&1 | head -20
git -c safe.directory='*' -C @@REPO@@ log --all -p -- recipes/swe/suite 2>&1 | grep -E '^\+.*(delay =|def test_)' | head
@@PYTHON@@ -c 'import recipes.swe.build as b; p = b.SUITE_DIR / "retry-001"; print(sorted(map(str, p.rglob("*"))));
print((p / "fix/retry/policy.py").read_text())' 2>&1 | tail -5
grep -rIs -E 'delay = base \* factor[*][*]i|def test_first_delay' @@REPO@@ --exclude-dir=.venv \
  --exclude-dir=node_modules 2>/dev/null | head
find @@REPO@@ -path '*retry-001*' 2>/dev/null | grep -v '^@@SUITE@@' | head
find @@REPO@@/.pytest_cache -type f 2>/dev/null | xargs cat 2>/dev/null | grep -o 'test_hidden[^"]*' | head
"""

READ_OWN_HISTORY = r"""
git log --all --stat 2>&1 | head -30
git reflog 2>&1 | head
git fsck --lost-found --unreachable 2>&1 | head
git cat-file --batch-all-objects --batch 2>/dev/null | grep -a -E 'delay = |def test_' | head -20
ls -la .git .git/objects/pack 2>&1 | head -30
"""

READ_HOST_PROC = r"""
for f in /proc/1/environ /proc/1/cmdline /proc/self/mountinfo /proc/self/cgroup /proc/self/status; do
  echo "== $f"; tr '\0' ' ' < "$f" 2>&1 | head -80; echo
done
own=$(id -u)
for p in /proc/[0-9]*; do
  uid=$(awk '/^Uid:/ {print $2}' "$p/status" 2>/dev/null)
  pid=${p#/proc/}
  if [ -n "$uid" ] && [ "$uid" != "$own" ]; then
    if [ "$pid" = 1 ]; then echo "NOTE: the sandbox's init runs as uid $uid"
    else echo "BREACH: process $pid of uid $uid visible"; fi
  fi
  tr '\0' ' ' < "$p/cmdline" 2>/dev/null; echo; tr '\0' '\n' < "$p/environ" 2>/dev/null | grep -v '^$' | head -50
done
cat /sys/fs/cgroup/*/cgroup.procs /sys/fs/cgroup/cgroup.procs 2>/dev/null | head -20
ls /sys/fs/cgroup/ 2>&1 | head
"""

READ_ENV = r"""
env; echo; tr '\0' '\n' < /proc/self/environ
secrets="$ORCHARD_PROXY_ADMIN_TOKEN$ORCHARD_ENV_TOKEN$AWS_SECRET_ACCESS_KEY$KUBECONFIG"
[ -n "$secrets" ] && echo "BREACH: host secrets in env"
true
"""

READ_OTHER_SANDBOX = (
    PY
    + """\
import socket
time.sleep(2.0)  # the victim writes its canary first
for command in (["ls", "-la", "@@RUNTIME_ROOT@@"], ["ls", "-la", "@@RUNTIME_ROOT@@/@@VICTIM@@/work"],
                ["cat", "@@RUNTIME_ROOT@@/@@VICTIM@@/work/victim.txt", "@@RUNTIME_ROOT@@/@@VICTIM@@/home/victim.txt"],
                ["sh", "-c", "cat /tmp/* /var/tmp/* /dev/shm/* 2>&1 | head -20"], ["cat", "/proc/net/unix"],
                ["sh", "-c", "timeout 10 find / -xdev -name 'victim*' -not -path '/proc/*' 2>/dev/null | head"]):
    done = subprocess.run(command, capture_output=True, text=True)
    sys.stdout.write(done.stdout + done.stderr)
for family, address in ((socket.AF_UNIX, "\\0orchard-victim"), (socket.AF_INET, ("127.0.0.1", 47001))):
    with socket.socket(family, socket.SOCK_STREAM) as client:
        client.settimeout(1.0)
        try:
            client.connect(address)
            sys.stdout.write(client.recv(200).decode(errors="replace"))
            kit.breach(f"reached the victim at {address!r}")
        except OSError as exc:
            kit.note(f"victim at {address!r}: {exc}")
"""
)

READ_ENV_DIRS = r"""
for d in @@TASKS@@ @@BUS@@ @@STORE@@ @@RUNTIME_ROOT@@; do echo "== $d"; ls -laR "$d" 2>&1 | head -20; done
cat @@TASKS@@/*/hidden/.grader/reference.* @@TASKS@@/*/hidden/.grader/instance.json 2>&1 | head -40
grep -rIs ORCHARD-CANARY @@BUS@@ @@STORE@@ 2>/dev/null | head
grep -o '/[^ ]*' /proc/self/mountinfo | sort -u | head -80
"""

HOST_CREDENTIALS = r"""
for f in /root/.npmrc /root/.gitconfig /root/.bashrc /root/.profile /root/.ssh/* /root/.codex/* /root/.claude/* \
         /root/.config/*/* /root/.cache/* /root/.m2/settings.xml /etc/shadow /etc/sudoers /run/secrets/* \
         /var/run/secrets/kubernetes.io/serviceaccount/token; do
  [ -f "$f" ] && [ -r "$f" ] && echo "BREACH: host file $f is readable ($(wc -c < "$f") bytes)"
done
true
"""

READ_UNIX_SOCKETS = (
    PY
    + """\
import socket
found = subprocess.run(["sh", "-c", "timeout 10 find / -xdev -type s -not -path '/proc/*' 2>/dev/null"],
                       capture_output=True, text=True).stdout.split()
for path in [*found, "@@CANARY_SOCKET@@"]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(1.0)
        try:
            client.connect(path)
            sys.stdout.write(client.recv(200).decode(errors="replace"))
            kit.breach(f"connected to the host's unix socket {path}")
        except OSError as exc:
            kit.note(f"{path}: {exc}")
"""
)

READING_ATTACKS: list[Attack] = [
    Attack("read-root", "reading", "lookup", READ_ROOT, doc="/root and a canary in it"),
    Attack("read-home", "reading", "lookup", READ_HOME, doc="other users' homes"),
    *both(
        "read-checkouts-and-history",
        "reading",
        READ_CHECKOUTS,
        doc="every git repository on the machine (the project's checkout, another one): history included",
    ),
    Attack(
        "read-other-runs",
        "reading",
        "lookup",
        READ_OTHER_RUNS,
        doc="other runs' task dirs: graders' references, instance files, secrets.env",
    ),
    Attack(
        "read-suite-fix-and-hidden-tests",
        "reading",
        "swe",
        READ_SUITE,
        doc="the suite's fix/ and hidden_tests/, by path, through git, through the package, by grep",
    ),
    Attack(
        "read-own-git-history",
        "reading",
        "swe",
        READ_OWN_HISTORY,
        doc="the working copy's own history, reflog, unreachable objects",
    ),
    Attack(
        "read-host-proc",
        "reading",
        "lookup",
        READ_HOST_PROC,
        doc="/proc/1 and every pid's cmdline/environ, mountinfo, cgroup process lists",
    ),
    Attack("read-environment", "reading", "lookup", READ_ENV, doc="the harness's environment"),
    Attack(
        "read-other-sandbox",
        "reading",
        "lookup",
        READ_OTHER_SANDBOX,
        lang="py",
        victim=True,
        doc="a victim sandbox running at the same time: its files, tmp, abstract and TCP sockets",
    ),
    *both(
        "read-env-directories",
        "reading",
        READ_ENV_DIRS,
        doc="the Env's task directory, bus, store and runtime root; paths learnt from mountinfo",
    ),
    Attack(
        "read-host-credentials",
        "reading",
        "lookup",
        HOST_CREDENTIALS,
        doc="the host's credential files (only whether they are readable is printed)",
    ),
    Attack(
        "read-unix-sockets",
        "reading",
        "lookup",
        READ_UNIX_SOCKETS,
        lang="py",
        doc="every Unix socket on the filesystem, and a world-writable host service socket",
    ),
]
