"""``--seeds auto``: stop when every 95% interval is within ``±target_ci`` AP, at ``max_seeds``, or when a cell failed.

Otherwise the next round's seed count is projected from the widest interval's spread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from detr_peg.errors import ConfigError
from detr_peg.lab.study.comparisons import format_points, seeds_for_half_width

#: ``--seeds auto``: the seeds of the first round.
FIRST_ROUND = 3


@dataclass(frozen=True)
class SeedRule:
    """The stopping rule of ``--seeds auto``: ``target_ci`` AP points, ``max_seeds``, and ``first_round`` seeds."""

    target_ci: float = 1.0
    max_seeds: int = 10
    first_round: int = FIRST_ROUND

    def __post_init__(self) -> None:
        if self.max_seeds < 2:
            raise ConfigError(f"--max-seeds must be at least 2 (an interval needs two seeds), got {self.max_seeds}.")

    def to_dict(self) -> dict[str, Any]:
        return {"target_ci": self.target_ci, "max_seeds": self.max_seeds, "first_round": self.first_round}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> SeedRule | None:
        if not data:
            return None
        return cls(
            target_ci=float(data["target_ci"]),
            max_seeds=int(data["max_seeds"]),
            first_round=int(data.get("first_round", FIRST_ROUND)),
        )

    def start(self, earlier_seeds: int) -> int:
        """Seeds of this run's first round: ``first_round``, or as many as the folder already planned."""
        return max(min(self.first_round, self.max_seeds), earlier_seeds)


def intervals_reached(comparisons: dict[str, Any], target: float) -> bool:
    """Whether the study compares something and every row's 95% half-width is at most ``target`` AP points."""
    rows = comparisons["rows"]
    return bool(rows) and all(r["half_width"] is not None and r["half_width"] <= target for r in rows)


def widest_half_width(comparisons: dict[str, Any]) -> float | None:
    """The largest 95% half-width of the comparison rows, in AP points (None when no row has an interval)."""
    widths = [r["half_width"] for r in comparisons["rows"] if r["half_width"] is not None]
    return max(widths) if widths else None


def _reached_max_seeds(comparisons: dict[str, Any], rule: SeedRule) -> str:
    """``reached --max-seeds 10 with intervals up to ±2.6 AP (target ±1.0)``."""
    widest = widest_half_width(comparisons)
    if widest is None:
        return f"reached --max-seeds {rule.max_seeds}"
    return (
        f"reached --max-seeds {rule.max_seeds} with intervals up to ±{widest:.1f} AP "
        f"(target ±{format_points(rule.target_ci)})"
    )


def stop_reason(comparisons: dict[str, Any], seeds: int, rule: SeedRule, failed: int = 0) -> str | None:
    """Why a study of ``seeds`` seeds per setting stops now, or None when another round is due."""
    if intervals_reached(comparisons, rule.target_ci):
        return f"all intervals within ±{format_points(rule.target_ci)} AP"
    if seeds >= rule.max_seeds:
        return _reached_max_seeds(comparisons, rule)
    if failed:
        return f"{failed} cell{'s' if failed > 1 else ''} failed; run the command again to retry"
    return None


def next_seeds(comparisons: dict[str, Any], seeds: int, rule: SeedRule) -> int:
    """Seeds per setting of the next round: the projection of the widest row, within ``seeds + 1 .. max_seeds``."""
    needed = [
        seeds_for_half_width(r["sd"], rule.target_ci)
        for r in comparisons["rows"]
        if r["half_width"] is None or r["half_width"] > rule.target_ci
    ]
    return min(rule.max_seeds, max([seeds + 1, *needed]))


def describe_stop(comparisons: dict[str, Any], seeds: int, rule: SeedRule, pending: str = "") -> str:
    """The report's sentence about the rule; ``pending`` (cells of the round not done) means the round is under way."""
    head = f"Seeds: auto (target ±{format_points(rule.target_ci)} AP, at most {rule.max_seeds} seeds); {seeds} seeds per setting"
    if pending:
        return f"{head}; this round is not finished (cells: {pending})."
    if intervals_reached(comparisons, rule.target_ci):
        return f"{head}; stopped: all intervals within ±{format_points(rule.target_ci)} AP."
    if seeds >= rule.max_seeds:
        return f"{head}; stopped: {_reached_max_seeds(comparisons, rule)}."
    return f"{head}; not finished: intervals wider than ±{format_points(rule.target_ci)} AP remain (run the command again)."
