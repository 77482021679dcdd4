"""One stage's evaluation as Markdown (``RUN_DIR/eval/<stage>.md``): the summary, the breakdown by each label, and
the cost. Rates are percentages with their Wilson 95% interval; unknown figures are shown as ``-``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from orchard.evaluation.breakdown import LabelGroup

if TYPE_CHECKING:
    from orchard.evaluation.cost import EvalCost
    from orchard.evaluation.heldout import HeldoutResult


def render_stage_markdown(result: HeldoutResult) -> str:
    """The stage's report: summary, then a section per breakdown label, then the cost."""
    sections = [_summary(result)]
    sections += [_breakdown(label, groups) for label, groups in result.breakdowns.items()]
    if result.cost is not None:
        sections.append(_cost(result.cost))
    return "\n\n".join(sections) + "\n"


def selection_text(selection: str, samples_per_task: int) -> str:
    """What a selection label means, in words.

    >>> selection_text("pass@2", 2)
    'pass@2: 2 attempts per task, solved when any attempt succeeds'
    """
    if selection.startswith("pass@"):
        return f"{selection}: {samples_per_task} attempts per task, solved when any attempt succeeds"
    if selection.startswith("rerank@"):
        return f"{selection}: {samples_per_task} attempts per task, the value model picks the one that counts"
    if samples_per_task > 1:
        return f"{selection}: {samples_per_task} attempts per task, the first one counts"
    return f"{selection}: one attempt per task"


def _summary(result: HeldoutResult) -> str:
    success, reward = result.success, result.reward
    interval = "" if reward.low is None or reward.high is None else f" [{reward.low:.3f}, {reward.high:.3f}]"
    rows = [
        ("run", result.run_id),
        ("selection", selection_text(result.selection, result.samples_per_task)),
        ("success", f"{success.rate:.1%} ({success.successes}/{success.n}), 95% CI [{success.low:.1%}, "
                    f"{success.high:.1%}]"),
        ("pass@1", f"{result.mean_success:.1%} (mean over {result.samples_per_task * success.n} attempts)"),
        ("mean reward", f"{reward.mean:.3f}{interval} ({reward.method} 95% CI)"),
        ("wall time", f"{result.wall_time_s:.1f} s"),
    ]  # fmt: skip
    if result.samples_per_task > 1:
        rows.insert(4, (f"pass@{result.samples_per_task}", f"{result.any_success:.1%}"))
    if result.missing:
        rows.append(("without outcome", f"{len(result.missing)} episode(s), counted as failures"))
    lines = [f"# Evaluation of stage {result.stage}", "", "| | |", "|---|---|"]
    return "\n".join(lines + [f"| {name} | {value} |" for name, value in rows])


def _breakdown(label: str, groups: Sequence[LabelGroup]) -> str:
    header = [
        f"## By {label}",
        "",
        f"| {label} | tasks | success rate | 95% CI | pass@1 |",
        "|---|---:|---:|---:|---:|",
    ]
    rows = [
        f"| {g.value} | {g.success.n} | {g.success.rate:.1%} ({g.success.successes}/{g.success.n}) "
        f"| [{g.success.low:.1%}, {g.success.high:.1%}] | {g.pass_at_1:.1%} |"
        for g in groups
    ]
    return "\n".join(header + rows)


def _cost(cost: EvalCost) -> str:
    tokens = "-" if cost.total_tokens is None else f"{cost.total_tokens:,}"
    prompt = "-" if cost.prompt_tokens is None else f"{cost.prompt_tokens:,}"
    completion = "-" if cost.completion_tokens is None else f"{cost.completion_tokens:,}"
    mean = "-" if cost.mean_episode_time_s is None else f"{cost.mean_episode_time_s:.1f}"
    lines = [
        "## Cost",
        "",
        "| model calls | prompt tokens | completion tokens | tokens | wall time (s) | episode time (s) "
        "| mean episode (s) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        f"| {cost.model_calls:,} | {prompt} | {completion} | {tokens} | {cost.wall_time_s:.1f} "
        f"| {cost.episode_time_s:.1f} | {mean} |",
    ]
    if cost.calls_read is not None and not cost.tokens_complete:
        read = f"Tokens of {cost.calls_read} of {cost.model_calls} model calls only (the rest not read in time)."
        lines += ["", read]
    elif cost.calls_read is None:
        lines += ["", "Tokens not counted."]
    return "\n".join(lines)
