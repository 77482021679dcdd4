"""How far a run is: each stage's goals, how much of each is done, at what rate, and the screen that tells it.

A stage's goals come from its recipe entries, each counted from what the run already publishes:

- the stage's ``until.topic``: the records on that topic, of ``until.count``;
- a ``rollout``: its training episodes (outcomes of this run outside ``eval-`` groups) ended since the stage began,
  of ``rounds * budget``, or of the lines of its ``demonstrations.jsonl``; at most ``episodes``;
- a ``policy-trainer``: the step of the last line of its ``metrics.jsonl`` (in the trainer's ``run_dir``), of its
  ``max_steps`` (its ``set`` entries over its ``config`` file); a ``value-trainer``: the trainer step of its model's
  newest published version, of ``max_steps``;
- a command running ``orchard eval --tasks DIR``: the tasks of its ``--stage`` with an episode ended since the stage
  began, of the task directories in DIR.

A goal whose total is unknown (no ``max_steps``, a task directory not written yet) has no bar. The rate is the change
of the count over the last ``RATE_WINDOW_S`` seconds the view saw, the ETA what is left at that rate; a count that
went back (another run of the trainer) starts the rate over.

Nothing here reads the bus or the run's files: the views (``orchard.run.live``, ``orchard.run.plain``) gather them into
``Figures``, so all of it is tested without a run. ``screen_lines`` lays the live view out to fit a terminal (80 x 24
included): the stage (k/n) and its description, a bar per goal, the latest loss, reward, success and held-out figure,
the stages (the running one with its components, completed ones a line each, the oldest folded into one line when
space runs out, pending ones on one line), the components no stage lists, the record counts.
"""

from __future__ import annotations

import textwrap
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import yaml
from rich.text import Text

from orchard.episode_groups import EVAL_GROUP_PREFIX
from orchard.run.config import (
    RUN_DIR,
    CommandComponent,
    ComponentSpec,
    PolicyTrainerComponent,
    RolloutComponent,
    RunConfig,
    StageConfig,
    ValueTrainerComponent,
)
from orchard.run.stages import StageState
from orchard.run.supervisor import ComponentState

Measure = Literal["records", "episodes", "eval-tasks", "trainer-step", "published-step"]
RATE_WINDOW_S = 120.0
MIN_RATE_SPAN_S = 3.0  # a rate needs this much history
DEFAULT_TRAINER_RUN_DIR = Path(".orchard/runs/policy")  # trainers.config.PolicyTrainerConfig.run_dir's default
DEMONSTRATIONS = "demonstrations.jsonl"
UP = ("starting", "healthy", "unhealthy")
MAX_BARS = 3
MIN_BAR = 10  # cells
DESCRIPTION_LINES = 2
_STATUS_STYLE = {"healthy": "green", "exited": "cyan", "starting": "yellow", "backoff": "yellow", "up": "green",
                 "unhealthy": "red", "failed": "bold red", "stopping": "magenta", "stopped": "dim"}  # fmt: skip
_MARKS = {"completed": ("✓", "green"), "running": ("▸", "bold yellow"), "failed": ("✗", "bold red"),
          "pending": ("·", "dim")}  # fmt: skip
_TOPIC_LABELS = (("model-calls", "calls"), ("outcomes", "episodes"), ("trajectories", "trajectories"),
                 ("samples", "samples"))  # fmt: skip


# ---------------------------------------------------------------------------------------------------- the records
@dataclass(frozen=True)
class Goal:
    """What one part of a stage counts toward."""

    name: str  # the component counted, or the topic of the stage's ``until``
    unit: str  # what is counted: records, episodes, steps, tasks
    measure: Measure
    key: str = ""  # records: the topic; eval-tasks: the group id prefix; published-step: the model
    total: int | None = None  # None: the view counts it from ``total_of``
    total_of: Path | None = None  # a task directory (its tasks) or a demonstrations.jsonl (its lines)
    cap: int | None = None  # the total is at most this
    metrics: Path | None = None  # trainer-step: the trainer's metrics.jsonl
    cap_only: bool = False  # the total is a cap the stage may end before (its end waits on something else)

    @property
    def label(self) -> str:
        """What the bar is called: ``trainer-rl steps``, or the topic."""
        return self.name if self.measure == "records" else f"{self.name} {self.unit}"


@dataclass(frozen=True)
class TrainerPoint:
    """The last step a trainer wrote to its ``metrics.jsonl``."""

    step: int
    loss: float | None = None
    time: float | None = None  # wall clock of the step


@dataclass(frozen=True)
class Heldout:
    """One row of ``results.json``: a stage's held-out success rate and its interval."""

    stage: str
    tasks: int
    success_rate: float
    low: float
    high: float


@dataclass
class Figures:
    """What the views read of a run, for its goals and its figures (empty where not known yet)."""

    counts: Mapping[str, int] = field(default_factory=dict)  # records per topic
    episode_ends_ms: Sequence[int] = ()  # when each training episode of this run ended
    eval_ends: Sequence[tuple[int, str]] = ()  # (ended ms, group id) of each evaluation episode of this run
    trainer_points: Mapping[str, TrainerPoint] = field(default_factory=dict)  # by policy-trainer component
    published_steps: Mapping[str, int] = field(default_factory=dict)  # model -> trainer step of its newest version
    versions: Mapping[str, int] = field(default_factory=dict)  # model -> its newest version
    totals: Mapping[str, int] = field(default_factory=dict)  # str(Goal.total_of) -> what it counts
    heldout: Sequence[Heldout] = ()  # results.json, in table order
    mean_reward: float | None = None
    success_rate: float | None = None
    recent: int = 0  # the outcomes the reward and success rate are of
    error: str | None = None  # why the bus could not be read


@dataclass(frozen=True)
class Progress:
    """One goal of a stage: how much of it is done, and how fast it goes (per second; None: not known yet)."""

    label: str
    done: int
    total: int
    rate: float | None = None
    cap_only: bool = False  # the total is only a cap: no ETA toward it

    @property
    def fraction(self) -> float:
        """Done, from 0 to 1."""
        return min(1.0, self.done / self.total) if self.total > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the current rate (0 once done; None while the rate is unknown)."""
        if self.done >= self.total:
            return 0.0
        return (self.total - self.done) / self.rate if self.rate else None


class Rates:
    """How fast each count moves: its change over the last ``window_s`` seconds it was observed."""

    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        self.window_s = window_s
        self._seen: dict[str, deque[tuple[float, int]]] = {}

    def observe(self, key: str, done: int, now: float) -> float | None:
        """Note ``done`` at ``now`` (seconds); the rate per second, None until ``MIN_RATE_SPAN_S`` of history.

        >>> rates = Rates()
        >>> rates.observe("a", 0, 0.0), rates.observe("a", 10, 5.0), rates.observe("a", 4, 6.0)
        (None, 2.0, None)
        """
        seen = self._seen.setdefault(key, deque())
        if seen and done < seen[-1][1]:
            seen.clear()  # the count went back: a new run of what is counted
        seen.append((now, done))
        while len(seen) > 2 and now - seen[1][0] >= self.window_s:
            seen.popleft()
        first_at, first = seen[0]
        span = now - first_at
        return (done - first) / span if span >= MIN_RATE_SPAN_S else None


# ---------------------------------------------------------------------------------------------------- goals
def stage_goals(stage: StageConfig, config: RunConfig, root: Path) -> list[Goal]:
    """The goals of ``stage``: its ``until.topic``, then those of its components, in the stage's order.

    ``root`` is the run directory (what ``{run_dir}`` stands for). A policy trainer's ``config`` file is read here.
    """
    goals: list[Goal] = []
    until = stage.until
    if until is not None and until.topic is not None:
        goals.append(Goal(until.topic, "records", "records", key=until.topic, total=until.count))
    ends = config.stage_exits(stage)
    for name in stage.components:
        goal = component_goal(name, config.components[name], root)
        if goal is not None and goal.measure in ("trainer-step", "published-step") and name not in ends:
            goal = replace(goal, cap_only=True)  # an RL trainer's max_steps while the stage ends with its rollout
        if goal is not None:
            goals.append(goal)
    return goals


def component_goal(name: str, spec: ComponentSpec, root: Path) -> Goal | None:
    """What component ``name`` counts toward, if it counts toward something the run can see."""
    if isinstance(spec, RolloutComponent):
        if spec.demos is not None:
            demos = Path(_in_run(str(spec.demos), root)) / DEMONSTRATIONS
            return Goal(name, "episodes", "episodes", total_of=demos, cap=spec.episodes)
        return Goal(name, "episodes", "episodes", total=(spec.rounds or 1) * spec.budget, cap=spec.episodes)
    if isinstance(spec, PolicyTrainerComponent):
        max_steps, run_dir = trainer_settings(spec, root)
        if max_steps is None:
            return None
        return Goal(name, "steps", "trainer-step", total=max_steps, metrics=run_dir / "metrics.jsonl")
    if isinstance(spec, ValueTrainerComponent):
        model = option(spec.args, "--name") or "value"
        return Goal(name, "steps", "published-step", key=model, total=spec.max_steps) if spec.max_steps else None
    if isinstance(spec, CommandComponent):
        words = [*spec.run, *spec.args]
        tasks = option(words, "--tasks")
        if "eval" not in words or tasks is None:
            return None
        stage = option(words, "--stage")
        prefix = f"{EVAL_GROUP_PREFIX}{stage}-" if stage else EVAL_GROUP_PREFIX
        return Goal(name, "tasks", "eval-tasks", key=prefix, total_of=Path(_in_run(tasks, root)))
    return None


def trainer_settings(spec: PolicyTrainerComponent, root: Path) -> tuple[int | None, Path]:
    """A policy trainer's ``max_steps`` and ``run_dir``: its ``set`` entries over its ``config`` file over the
    trainer's defaults (a config file that cannot be read counts as empty)."""
    values: dict[str, Any] = {}
    if spec.config is not None:
        try:
            loaded = yaml.safe_load(Path(_in_run(str(spec.config), root)).read_text())
        except (OSError, yaml.YAMLError):
            loaded = None
        values.update(loaded if isinstance(loaded, dict) else {})
    for entry in spec.set:
        key, _, value = _in_run(entry, root).partition("=")
        values[key.strip()] = _yaml_or_text(value)
    max_steps = values.get("max_steps")
    run_dir = values.get("run_dir")
    return (max_steps if isinstance(max_steps, int) else None,
            Path(str(run_dir)) if run_dir else DEFAULT_TRAINER_RUN_DIR)  # fmt: skip


def trainer_metrics(config: RunConfig, root: Path) -> dict[str, Path]:
    """The ``metrics.jsonl`` of every policy trainer of the recipe, by component name."""
    return {name: trainer_settings(spec, root)[1] / "metrics.jsonl"
            for name, spec in config.components.items() if isinstance(spec, PolicyTrainerComponent)}  # fmt: skip


def option(words: Sequence[str], flag: str) -> str | None:
    """The word after ``flag`` in ``words`` (the last one given), None without it.

    >>> option(["eval", "--stage", "a", "--stage", "b"], "--stage"), option(["eval"], "--stage")
    ('b', None)
    """
    found = [words[i + 1] for i, word in enumerate(words[:-1]) if word == flag]
    return found[-1] if found else None


def _in_run(text: str, root: Path) -> str:
    return text.replace(RUN_DIR, str(root))


def _yaml_or_text(value: str) -> Any:
    try:
        return yaml.safe_load(value)
    except yaml.YAMLError:
        return value


# ---------------------------------------------------------------------------------------------------- progress
def measured(goal: Goal, figures: Figures, since_ms: int | None) -> int | None:
    """How much of ``goal`` is done (None while nothing says); episodes and tasks count from ``since_ms``."""
    if goal.measure == "records":
        return figures.counts.get(goal.key)
    if goal.measure == "trainer-step":
        point = figures.trainer_points.get(goal.name)
        return None if point is None else point.step
    if goal.measure == "published-step":
        return figures.published_steps.get(goal.key)
    if since_ms is None:
        return None
    if goal.measure == "episodes":
        return sum(1 for ended in figures.episode_ends_ms if ended >= since_ms)
    return len({group for ended, group in figures.eval_ends if ended >= since_ms and group.startswith(goal.key)})


def goal_total(goal: Goal, figures: Figures) -> int | None:
    """The total of ``goal``: given, or counted by the view from ``total_of``; at most ``cap``."""
    total = goal.total if goal.total is not None else figures.totals.get(str(goal.total_of))
    if total is None:
        return None
    return min(total, goal.cap) if goal.cap is not None else total


def stage_progress(
    stage: StageState, goals: Sequence[Goal], figures: Figures, rates: Rates, now: float
) -> list[Progress]:
    """The progress of each goal of ``stage`` that has a total; ``now`` is the monotonic time of the rates."""
    out: list[Progress] = []
    for goal in goals:
        total = goal_total(goal, figures)
        if not total:
            continue
        done = measured(goal, figures, stage.since_ms)
        rate = None if done is None else rates.observe(f"{stage.config.name}/{goal.label}", done, now)
        out.append(Progress(goal.label, done or 0, total, rate, goal.cap_only))
    return out


def focus_stage(stages: Sequence[StageState]) -> StageState | None:
    """The stage to show: the one running (or the one that failed), else the next; None once all are done."""
    return next((s for s in stages if s.status in ("running", "failed")), None) or next(
        (s for s in stages if s.status == "pending"), None
    )


def latest_loss(figures: Figures) -> tuple[str, int, float] | None:
    """The trainer that wrote a loss last: its name, that step and the loss."""
    points = [(p.time or 0.0, name, p.step, p.loss) for name, p in figures.trainer_points.items() if p.loss is not None]
    if not points:
        return None
    _, name, step, loss = max(points, key=lambda item: item[0])
    return name, step, loss


# ---------------------------------------------------------------------------------------------------- words
def clock(seconds: float) -> str:
    """``H:MM:SS``.

    >>> clock(3725.9)
    '1:02:05'
    """
    minutes, secs = divmod(int(max(0.0, seconds)), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"


def eta_text(progress: Progress) -> str:
    """``ETA 0:01:36``, ``done``, ``ETA -`` while the rate is unknown, or ``cap`` when the total is only a cap the
    stage may end before (an RL trainer's ``max_steps``: its stage ends with its rollout)."""
    eta = progress.eta_s
    if progress.done >= progress.total:
        return "done"
    if progress.cap_only:
        return "cap"
    return "ETA -" if eta is None else f"ETA {clock(eta)}"


def rate_text(rate: float | None) -> str:
    """A rate per second as the eye reads it (``3.1/s``, ``12/min``); '' when unknown.

    >>> rate_text(3.14), rate_text(0.2), rate_text(None)
    ('3.1/s', '12/min', '')
    """
    if rate is None:
        return ""
    return f"{rate:.1f}/s" if rate >= 1 else f"{rate * 60:.2g}/min"


def progress_summary(progress: Progress) -> str:
    """One goal on one line of plain text: ``trainer steps 412/1000 (41%) ETA 0:03:10``."""
    return f"{progress.label} {progress.done}/{progress.total} ({progress.fraction:.0%}) {eta_text(progress)}"


def heldout_text(rows: Sequence[Heldout]) -> str:
    """The newest held-out row with its interval, and the one before it: the story of the evaluations."""
    if not rows:
        return "held-out: none yet"
    last = rows[-1]
    text = f"held-out {last.stage} {last.success_rate:.1%} [{last.low:.1%}, {last.high:.1%}] of {last.tasks}"
    if len(rows) > 1:
        text += f" · before: {rows[-2].stage} {rows[-2].success_rate:.1%}"
    return text


def until_text(stage: StageConfig, config: RunConfig) -> str:
    """When ``stage`` is done, in words."""
    until, parts = stage.until, []
    exits = config.stage_exits(stage)
    if exits:
        parts.append(f"{', '.join(exits)} exited")
    if until is not None:
        if until.policy_version is not None:
            parts.append(f"policy v{until.policy_version} published")
        if until.topic is not None:
            parts.append(f"{until.count} records on {until.topic}")
        if until.scored_by:
            parts.append(f"scored by {', '.join(until.scored_by)}")
        if until.caught_up:
            parts.append(f"{', '.join(until.caught_up)} caught up")
    return "done when " + "; ".join(parts) if parts else "runs until the run is stopped"


def status_counts(states: Iterable[ComponentState]) -> Counter[str]:
    """How many components are up (starting, healthy, unhealthy) or in each other status."""
    return Counter("up" if c.status in UP else c.status for c in states)


def components_text(states: Sequence[ComponentState], *, completed: bool = False) -> str:
    """``5 components stopped``, ``5 components: 4 stopped, 1 exited`` (a completed stage's pending components ran
    before the run was resumed)."""
    counts = status_counts(states)
    if completed and "pending" in counts:
        counts["done before"] = counts.pop("pending")
    noun = "component" if len(states) == 1 else "components"
    if len(counts) == 1:
        return f"{len(states)} {noun} {next(iter(counts))}"
    return f"{len(states)} {noun}: " + ", ".join(f"{n} {status}" for status, n in counts.most_common())


def records_text(figures: Figures) -> str:
    """Record counts and the newest version of each model."""
    if figures.error and not figures.counts:
        return f"bus n/a ({figures.error})"
    parts = [f"{label} {short_count(figures.counts.get(topic, 0))}" for topic, label in _TOPIC_LABELS]
    parts += [f"{model} v{version}" for model, version in sorted(figures.versions.items())]
    return " · ".join(parts)


def short_count(n: int) -> str:
    """A count in at most six characters.

    >>> short_count(9999), short_count(23456), short_count(1_234_567)
    ('9999', '23.5k', '1.23M')
    """
    if n < 10_000:
        return str(n)
    return f"{n / 1000:.1f}k" if n < 1_000_000 else f"{n / 1_000_000:.3g}M"


def figures_text(figures: Figures) -> str:
    """The latest loss (which trainer, which step), and the recent reward and success rate."""
    latest = latest_loss(figures)
    loss = "loss -" if latest is None else f"loss {latest[2]:.4f} ({latest[0]} step {latest[1]})"
    reward = "reward -" if figures.mean_reward is None else f"reward {figures.mean_reward:.3f}"
    success = "success -" if figures.success_rate is None else f"success {figures.success_rate:.0%}"
    recent = f" (last {figures.recent})" if figures.recent else ""
    return f"{loss} · {reward} · {success}{recent}"


# ---------------------------------------------------------------------------------------------------- the screen
@dataclass(frozen=True)
class Snapshot:
    """Everything the live view shows at one moment."""

    run_id: str
    config: RunConfig
    stages: Sequence[StageState]
    components: Sequence[ComponentState]
    figures: Figures
    progress: Sequence[Progress] = ()  # of the focus stage
    elapsed_s: float = 0.0  # since the view started
    now: float = 0.0  # wall clock (stage times)


def screen_lines(snap: Snapshot, width: int = 80, height: int = 24) -> list[Text]:
    """The live view as at most ``height`` lines of at most ``width`` cells."""
    stage = focus_stage(snap.stages)
    head = [_header(snap, stage), *_about(snap, stage, width)]
    head += [Text(figures_text(snap.figures)), Text(heldout_text(snap.figures.heldout), style="bold")]
    staged = snap.config.staged()
    loose = [c for c in snap.components if c.name not in staged]
    foot = [Text(records_text(snap.figures), style="dim")]
    if snap.stages and loose:
        foot.insert(0, _inline_states("   run-wide: ", loose))
    budget = max(0, height - len(head) - len(foot))
    body = _stage_body(snap, stage, budget) if snap.stages else _rows(loose, budget, indent=1)
    return [_fit(line, width) for line in [*head, *body, *foot][:height]]


def _header(snap: Snapshot, stage: StageState | None) -> Text:
    """``orchard RUN_ID · stage k/n NAME H:MM:SS · run H:MM:SS``."""
    text = Text("orchard ", style="bold")
    text.append(snap.run_id, style="bold cyan")
    if stage is not None:
        text.append(f" · stage {snap.stages.index(stage) + 1}/{len(snap.stages)} ")
        text.append(stage.config.name, style="bold yellow")
        if stage.started_at:
            text.append(f" {clock(snap.now - stage.started_at)}")
    elif snap.stages:
        done = sum(s.status == "completed" for s in snap.stages)
        text.append(f" · {done}/{len(snap.stages)} stages completed")
    return text.append(f" · run {clock(snap.elapsed_s)}")


def _about(snap: Snapshot, stage: StageState | None, width: int) -> list[Text]:
    """The stage's description, its bars (or, without any, when it is done)."""
    if stage is None:
        return []
    lines = [Text("  " + line, style="italic") for line in _wrapped(stage.config.description, width - 2)]
    bars = list(snap.progress[:MAX_BARS])
    if not bars:
        return [*lines, Text("  " + until_text(stage.config, snap.config), style="dim")]
    label_width = min(24, max(len(p.label) for p in bars))
    return [*lines, *(_bar_line(p, width, label_width) for p in bars)]


def _wrapped(text: str, width: int) -> list[str]:
    lines = textwrap.wrap(text, max(10, width))
    if len(lines) <= DESCRIPTION_LINES:
        return lines
    return [*lines[: DESCRIPTION_LINES - 1], " ".join(lines[DESCRIPTION_LINES - 1 :])]  # cut by _fit


def _bar_line(progress: Progress, width: int, label_width: int) -> Text:
    """``  trainer steps   ━━━━━━━━━─────────  412/1000  41%  2.0/s  ETA 0:04:54``."""
    right = f" {progress.done}/{progress.total} {progress.fraction:>4.0%}"
    rate, eta = rate_text(progress.rate), eta_text(progress)
    tail = f"  {rate}  {eta}" if rate else f"  {eta}"
    fixed = 2 + label_width + 1 + len(right)
    if width - fixed - len(tail) < MIN_BAR:
        tail = f"  {eta}"  # a narrow screen: the rate goes first
    bar_width = max(0, width - fixed - len(tail))
    text = Text(f"  {progress.label[:label_width]:<{label_width}} ")
    filled = round(progress.fraction * bar_width)
    text.append("━" * filled, style="green").append("─" * (bar_width - filled), style="grey35")
    return text.append(right).append(tail, style="bold")


def _stage_body(snap: Snapshot, focus: StageState | None, budget: int) -> list[Text]:
    """The stages: completed ones (folded as needed), the focus stage and its components, the pending ones."""
    stages = list(snap.stages)
    at = stages.index(focus) if focus is not None else len(stages)
    done, later = stages[:at], stages[at + 1 :]
    by_name = {c.name: c for c in snap.components}
    rows = [] if focus is None else [by_name[name] for name in focus.config.components if name in by_name]
    focus_lines = [] if focus is None else [_stage_line(snap, focus)]
    pending = [_stage_line(snap, s) for s in later]
    if len(done) + len(focus_lines) + len(rows) + len(pending) > budget and len(pending) > 1:
        pending = [_folded(snap, later, "next: ")]
    room = budget - len(focus_lines) - len(pending) - len(rows)
    completed = _completed_lines(snap, done, max(1, room) if done else 0)
    room_for_rows = budget - len(completed) - len(focus_lines) - len(pending)
    return [*completed, *focus_lines, *_rows(rows, room_for_rows, indent=6), *pending]


def _completed_lines(snap: Snapshot, done: list[StageState], room: int) -> list[Text]:
    """A line per completed stage; the oldest folded into one line when they do not all fit in ``room``."""
    if len(done) <= room:
        return [_stage_line(snap, s) for s in done]
    kept = max(0, room - 1)
    folded = done[: len(done) - kept]
    return [_folded(snap, folded, ""), *(_stage_line(snap, s) for s in done[len(done) - kept :])]


def _stage_line(snap: Snapshot, stage: StageState) -> Text:
    """`` ✓  2 demos            0:05:31  5 components stopped`` (a pending stage: its description)."""
    mark, style = _MARKS[stage.status]
    names = max(len(s.config.name) for s in snap.stages)
    index = len(str(len(snap.stages)))
    text = Text(f" {mark} ", style=style)
    text.append(f"{snap.stages.index(stage) + 1:>{index}} {stage.config.name:<{min(20, names)}} ")
    if stage.status == "pending":
        return text.append(f"{'':>7}  {stage.config.description}", style="dim")
    end = stage.ended_at or snap.now
    text.append(f"{clock(end - stage.started_at) if stage.started_at else '-':>7}  ")
    states = [c for c in snap.components if c.name in stage.config.components]
    return text.append(components_text(states, completed=stage.status == "completed"), style="dim")


def _folded(snap: Snapshot, stages: list[StageState], prefix: str) -> Text:
    """`` ✓ 1-5 setup, demos, ...``: several stages on one line."""
    first, last = snap.stages.index(stages[0]) + 1, snap.stages.index(stages[-1]) + 1
    mark, style = _MARKS[stages[0].status]
    span = f"{first}" if first == last else f"{first}-{last}"
    text = Text(f" {mark} ", style=style).append(f"{span} {prefix}")
    return text.append(", ".join(s.config.name for s in stages), style="dim")


def _rows(states: Sequence[ComponentState], room: int, *, indent: int) -> list[Text]:
    """A row per component; past ``room``, the rest on one line by status."""
    if room <= 0 or not states:
        return []
    names = min(22, max(len(c.name) for c in states))
    if len(states) > room:
        rest = states[room - 1 :]
        counts = ", ".join(f"{n} {status}" for status, n in status_counts(rest).most_common())
        more = Text(" " * indent + f"+{len(rest)} more: {counts}", style="dim")
        return [*(_row(c, indent, names) for c in states[: room - 1]), more]
    return [_row(c, indent, names) for c in states]


def _row(state: ComponentState, indent: int, names: int) -> Text:
    """``      trainer-rl   healthy   pid 4242    up 0:12:04  restarts 1``."""
    text = Text(" " * indent + f"{state.name:<{names}} ")
    text.append(f"{state.status:<9}", style=_STATUS_STYLE.get(state.status, ""))
    text.append(f" pid {state.pid or '-':<7}")
    uptime = state.uptime_s()
    text.append(f" up {clock(uptime)}" if uptime is not None else "")
    text.append(f"  restarts {state.restarts}" if state.restarts else "")
    text.append(f"  exit {state.exit_code}" if state.exit_code is not None else "")
    text.rstrip()
    return text


def _inline_states(prefix: str, states: Sequence[ComponentState]) -> Text:
    text = Text(prefix, style="dim")
    for i, state in enumerate(states):
        text.append(", " if i else "").append(f"{state.name} ")
        text.append(state.status, style=_STATUS_STYLE.get(state.status, ""))
    return text


def _fit(line: Text, width: int) -> Text:
    """``line`` on one line of at most ``width`` cells (cut with an ellipsis)."""
    line = line.copy()
    line.no_wrap, line.overflow = True, "ellipsis"
    line.truncate(width, overflow="ellipsis")
    return line
