"""``orchard run`` with its output piped (no terminal): a plain line per event, status lines, where to look at the
end, and the exit code (0 completed, 1 failed, 1 for a --duration run with a component failing, 130 on SIGINT).

Each test but the last runs the installed command on a tiny recipe of command components (``sleep``, ``python -c``)
in its own run directory, on the run's own embedded bus and store; the last one asks a view for its status line."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from orchard.config import OrchardConfig
from orchard.run.config import load_run_config
from orchard.run.live import Metrics, PublishedWeights
from orchard.run.plain import PlainView
from orchard.run.rundir import RunDir
from orchard.run.stages import StageRunner
from orchard.run.supervisor import ComponentState

ORCHARD = str(Path(sys.executable).with_name("orchard"))
PYTHON = sys.executable
TIME = re.compile(r"^\d\d:\d\d:\d\d ")

PUBLISH = """\
import os, pathlib
from orchard.bus import open_bus
from orchard.config import load_config
from orchard.store import open_store
from trainers.weights import publish_policy_version

config = load_config(pathlib.Path(os.environ["ORCHARD_CONFIG"]))
weights = pathlib.Path(os.environ["ORCHARD_CONFIG"]).parent / "weights.bin"
weights.write_bytes(b"w" * 64)
with open_bus(config.bus) as bus, bus.producer() as producer:
    store = open_store(config.store)
    for version in (1, 2):
        publish_policy_version(store, producer, run_id=config.run_id, model="policy", version=version,
                               files={"weights.bin": weights}, trainer_step=10 * version)
    producer.flush()
    store.close()
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def orchard_run(recipe: Path, run_dir: Path, *args: str) -> subprocess.Popen[str]:
    """``orchard run`` with stdout a pipe (stderr, its log lines, to a file beside the run)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHARD_")}
    errors = (run_dir.parent / f"{run_dir.name}.stderr").open("w")
    return subprocess.Popen(
        [ORCHARD, "run", str(recipe), "--run-dir", str(run_dir), "--status-every", "0.3", *args],
        env=env, cwd=recipe.parent, stdout=subprocess.PIPE, stderr=errors, text=True,
    )  # fmt: skip


def finish(process: subprocess.Popen[str]) -> tuple[int, list[str]]:
    """The exit code and the output lines, each less its ``HH:MM:SS`` prefix."""
    out, _ = process.communicate(timeout=90)
    return process.returncode, [TIME.sub("", line) for line in out.splitlines()]


def events(lines: list[str]) -> list[str]:
    """The event lines, pids and durations replaced by placeholders; not the status lines, nor a command's
    "healthy" (it is alive for 1 s: a matter of timing)."""
    kept = [line for line in lines if not line.startswith("status ") and not line.endswith(" healthy")]
    return [re.sub(r"\d+:\d\d:\d\d", "T", re.sub(r"pid \d+", "pid P", line)) for line in kept]


def test_a_piped_staged_run_tells_each_event_a_status_and_where_its_weights_are(tmp_path: Path) -> None:
    write(tmp_path, "publish.py", PUBLISH)
    recipe = write(tmp_path, "recipe.yaml", f"""\
components:
  train: {{kind: command, run: [{PYTHON}, "{{recipe_dir}}/publish.py"]}}
  nap: {{kind: command, run: [sleep, "1.5"]}}
stages:
  - {{name: sft, description: publish two versions, components: [train]}}
  - {{name: rest, components: [nap]}}
""")  # fmt: skip
    run_dir = tmp_path / "run"
    code, lines = finish(orchard_run(recipe, run_dir))
    root = run_dir.resolve()
    store = f"{(root / 'store').as_uri()}/runs/{run_dir.name}/policy/v0000000002/"
    assert code == 0, lines
    assert events(lines) == [
        f"run {root}: 2 stages: sft -> rest",
        "stage 1/2 sft started (train): publish two versions",
        "sft: train started (pid P)",
        "sft: train exited 0",
        "stage 1/2 sft completed in T",
        "stage 2/2 rest started (nap)",
        "rest: nap started (pid P)",
        "rest: nap exited 0",
        "stage 2/2 rest completed in T",
        "completed (all 2 stages completed) after T, exit code 0",
        "results: none (no evaluation wrote results.md)",
        f"plot:    none yet; draw it: orchard eval --plot --run-dir {root}",
        f"weights: policy v2 (trainer step 20) at {store}",
        f"logs:    {root / 'logs'}",
    ]
    statuses = [line for line in lines if line.startswith("status ")]
    assert any(" | stage 2/2 rest " in line for line in statuses), statuses
    assert statuses[-1].endswith(" | components 2 exited | calls 0, episodes 0, trajectories 0, samples 0, policy v2")


def test_a_failing_component_shows_its_last_log_lines_and_the_run_exits_1(tmp_path: Path) -> None:
    bad = "import sys; print('reading settings'); sys.exit('error: learning_rate is not a field of trainer')"
    recipe = write(tmp_path, "recipe.yaml", f"""\
components:
  bad: {{kind: command, run: [{PYTHON}, -c, "{bad}"]}}
restart: {{max_restarts: 1, backoff_s: 0.1}}
""")  # fmt: skip
    run_dir = tmp_path / "run"
    code, lines = finish(orchard_run(recipe, run_dir))
    assert code == 1
    assert events(lines)[1:7] == [
        "bad started (pid P)",
        "bad down (exit code 1); restarting in 0.1 s (restart 1)",
        "bad started (pid P, restart 1)",
        "bad failed (exit code 1)",
        "  | reading settings",
        "  | error: learning_rate is not a field of trainer",
    ]
    assert f"  full log: {(run_dir / 'logs' / 'bad.log').resolve()}" in lines
    assert "failed (component(s) failed: bad) after T, exit code 1" in events(lines)
    assert f"resume:  orchard run --resume {run_dir.resolve()}" in lines


def test_a_duration_run_exits_0_only_when_nothing_is_failing_as_it_stops(tmp_path: Path) -> None:
    recipe = write(tmp_path, "recipe.yaml", f"""\
components:
  server: {{kind: command, run: [sleep, "60"]}}
  crashy: {{kind: command, run: [{PYTHON}, -c, "raise SystemExit(3)"]}}
restart: {{max_restarts: 50, backoff_s: 0.3}}
""")  # fmt: skip
    code, lines = finish(orchard_run(recipe, tmp_path / "looping", "--duration", "2.5"))
    assert code == 1
    assert "stopped (duration reached; failing when it stopped: crashy) after T, exit code 1" in events(lines)

    healthy = write(tmp_path, "healthy.yaml", "components:\n  server: {kind: command, run: [sleep, '60']}\n")
    code, lines = finish(orchard_run(healthy, tmp_path / "healthy", "--duration", "1.5"))
    assert code == 0
    assert "stopped (duration reached) after T, exit code 0" in events(lines)


def test_ctrl_c_stops_the_run_and_exits_130(tmp_path: Path) -> None:
    recipe = write(tmp_path, "recipe.yaml", "components:\n  server: {kind: command, run: [sleep, '60']}\n")
    process = orchard_run(recipe, tmp_path / "run")
    assert process.stdout is not None
    deadline = time.monotonic() + 60
    while "server started" not in process.stdout.readline():  # the line arrives while the run goes: unbuffered
        assert time.monotonic() < deadline and process.poll() is None
    process.send_signal(signal.SIGINT)
    code, lines = finish(process)
    root = (tmp_path / "run").resolve()
    assert code == 130
    assert events(lines)[-7:] == [
        "server stopped",
        "stopped (signal SIGINT) after T, exit code 130",
        "results: none (no evaluation wrote results.md)",
        f"plot:    none yet; draw it: orchard eval --plot --run-dir {root}",
        "weights: none published",
        f"logs:    {root / 'logs'}",
        f"resume:  orchard run --resume {root}",
    ]


class FakeMetrics:
    """What ``BusMetrics`` gives a view, without a bus."""

    def __init__(self) -> None:
        self.config = OrchardConfig(run_id="file-lookup")

    def read(self, *, fresh: bool = False) -> Metrics:
        return Metrics(counts={"samples": 640}, weights={"policy": PublishedWeights("policy", 1, "file:///v1/", 400)})

    def close(self) -> None:
        pass


def test_the_status_line_tells_the_stage_goals_done_of_their_totals_and_the_latest_loss(tmp_path: Path) -> None:
    config = load_run_config(Path(__file__).resolve().parents[3] / "recipes" / "file_lookup" / "recipe.yaml")
    runner = StageRunner(config, probe=None)
    for stage in runner.stages[:2]:
        stage.status, stage.started_at, stage.ended_at = "completed", time.time() - 100, time.time() - 60
    runner.stages[2].status, runner.stages[2].started_at = "running", time.time() - 60
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "metrics.jsonl").write_text('{"step": 412, "loss": 0.41234, "time": 1.0}\n')
    view = PlainView(FakeMetrics(), runner, RunDir(tmp_path), out=io.StringIO())  # type: ignore[arg-type]
    line = view.status_line([ComponentState("trainer", "policy-trainer", [], status="healthy")], FakeMetrics().read())
    assert re.fullmatch(
        r"status 0:00:00 \| stage 3/14 sft-successful 0:01:0\d \| trainer steps 412/1000 \(41%\) ETA - "
        r"\| loss 0\.4123 \(trainer step 412\) \| components 1 up "
        r"\| calls 0, episodes 0, trajectories 0, samples 640, policy v1",
        line,
    ), line
