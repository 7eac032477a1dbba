"""The analyzer registry: each analysis the service runs, what it reads, what it writes and when it runs.

An analysis is one pure module in ``analyzers/`` (sometimes two) and a small runner here in the service
layer that reads its frames, calls it and hands back what it concluded. Runners register themselves with
the registry of their cadence, in the module of their domain:

- ``JOB`` (``services.jobs``): once per job, over everything the store holds of it — when a job's data
  changes (beat's ``analyze-active-jobs``, which folds the step-based ones from the job's watermark,
  ``services.job_fold``), on ``POST /api/v1/jobs/{id}/analyze`` and ``fleetscope job analyze``.
- ``WINDOW`` (``services.health``): once per fleet window, over the window's telemetry — beat's
  ``health-window`` and ``GET /api/v1/health``; with ``FLEETSCOPE_SWEEP_SHARDS`` > 1 the analyses registered
  ``sharded`` run once per shard of hosts (``services.shards``), over that shard's GPUs, the others once.
- ``SCHEDULED`` (``services.scheduled``): fleet analyses with a window and a clock of their own (the energy
  and tier roll-ups, post-market monitoring, the serving window, the teams showback), each one beat entry
  sending one worker task. These entries carry no runner: the task (``worker/tasks.py``) is the runner, since
  what it does around the service call (its arguments, its fan-out over shards of hosts) is Celery's.

Job analysis, the health sweep, beat's schedule, the API's ``GET /api/v1/fleet/analyzers`` and ``fleetscope
fleet analyzers`` all loop over these registries; adding an analysis is its module in ``analyzers/`` plus one
registered runner (a scheduled one: its registration and the task its beat entry sends).
Order matters within a cadence: a runner may use what an earlier one left in the run's ``shared`` dict
(the health sweep's topology, say), so runners register in the order they run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

Run = TypeVar("Run")


@dataclass(frozen=True)
class Analysis(Generic[Run]):
    """One registered analysis.

    ``needs``: frames that must hold rows for the analysis to run at all (a job without steps has no C3
    breakdown); when one is empty the run notes it and skips the analysis. ``reads`` and ``writes`` are
    the canonical frames it reads and the ones its conclusions go to."""

    name: str
    cadence: str
    modules: tuple[str, ...]
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    summary: str
    run: Callable[[Run], None]
    needs: tuple[str, ...] = ()
    sharded: bool = False

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "cadence": self.cadence, "modules": list(self.modules), "reads": list(self.reads),
                "writes": list(self.writes), "needs": list(self.needs), "sharded": self.sharded, "summary": self.summary}


class Registry(Generic[Run]):
    """The analyses of one cadence, in the order they run."""

    def __init__(self, cadence: str, skip_notes: dict[str, str] | None = None):
        self.cadence = cadence
        # One note per missing frame, naming every analysis it skips, rather than one note per analysis.
        self.skip_notes = skip_notes or {}
        self._items: dict[str, Analysis[Run]] = {}

    def register(self, name: str, *, modules: tuple[str, ...], reads: tuple[str, ...], writes: tuple[str, ...],
                 summary: str, needs: tuple[str, ...] = (), sharded: bool = False) -> Callable[[Callable[[Run], None]], Callable[[Run], None]]:
        """Decorate a runner to register it under ``name``; ``sharded``: it runs per shard of hosts when the sweep
        is split (``FLEETSCOPE_SWEEP_SHARDS``), each shard over its own GPUs, the rest once for the fleet."""

        def add(run: Callable[[Run], None]) -> Callable[[Run], None]:
            if name in self._items:
                raise ValueError(f"analysis {name!r} is registered twice for cadence {self.cadence!r}")
            self._items[name] = Analysis(name, self.cadence, modules, reads, writes, summary, run, needs, sharded)
            return run

        return add

    def __iter__(self) -> Iterator[Analysis[Run]]:
        return iter(list(self._items.values()))

    def __len__(self) -> int:
        return len(self._items)

    def names(self) -> list[str]:
        return list(self._items)

    def run_all(self, run: Run, has_rows: Callable[[str], bool], note: Callable[[str], None],
                only: Callable[[Analysis[Run]], bool] | None = None) -> list[str]:
        """Run every analysis whose needed frames hold rows (of those ``only`` keeps), in order; note each frame
        that skipped some. Returns the names of the analyses that ran."""
        ran: list[str] = []
        skipped: dict[str, list[str]] = {}
        for a in self:
            if only is not None and not only(a):
                continue
            missing = [f for f in a.needs if not has_rows(f)]
            if missing:
                skipped.setdefault(missing[0], []).append(a.name)
                continue
            a.run(run)
            ran.append(a.name)
        for frame, names in skipped.items():
            note(self.skip_notes.get(frame) or f"no {frame} data: {', '.join(names)} skipped")
        return ran


@dataclass(frozen=True)
class Beat:
    """One beat entry: its name (under which ``beat_entry`` keeps its last send, so renaming one re-sends it),
    the Celery task it sends and when, either every ``every_s`` seconds or at a five-field ``crontab``
    ("minute hour day-of-month month day-of-week", UTC)."""

    entry: str
    task: str
    every_s: float | None = None
    crontab: str | None = None

    def __post_init__(self) -> None:
        if (self.every_s is None) == (self.crontab is None):
            raise ValueError(f"beat entry {self.entry!r}: give every_s or crontab, one of the two")
        if self.every_s is not None and not self.every_s > 0:
            raise ValueError(f"beat entry {self.entry!r}: every_s must be positive, got {self.every_s!r}")
        if self.crontab is not None and len(self.crontab.split()) != 5:
            raise ValueError(f"beat entry {self.entry!r}: crontab {self.crontab!r} needs five fields, e.g. '7 * * * *'")

    @property
    def when(self) -> str:
        return f"every {self.every_s:g} s" if self.every_s is not None else f"at crontab '{self.crontab}' UTC"


@dataclass(frozen=True)
class Scheduled:
    """One fleet analysis beat runs on a clock of its own: ``beat`` says which entry, task and when.
    ``files``: what it writes outside the database (the showback's reports), beside the tables in ``writes``."""

    name: str
    beat: Beat
    modules: tuple[str, ...]
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    summary: str
    files: tuple[str, ...] = ()
    sharded: bool = False
    cadence: str = "scheduled"

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "cadence": self.cadence, "modules": list(self.modules), "reads": list(self.reads),
                "writes": list(self.writes), "needs": [], "sharded": self.sharded, "summary": self.summary}


class Timetable:
    """The scheduled analyses, in the order they are listed; a name and a beat entry are each registered once."""

    def __init__(self, cadence: str = "scheduled"):
        self.cadence = cadence
        self._items: dict[str, Scheduled] = {}

    def register(self, name: str, *, beat: Beat, modules: tuple[str, ...], reads: tuple[str, ...], writes: tuple[str, ...],
                 summary: str, files: tuple[str, ...] = (), sharded: bool = False) -> Scheduled:
        if name in self._items:
            raise ValueError(f"analysis {name!r} is registered twice for cadence {self.cadence!r}")
        if any(a.beat.entry == beat.entry for a in self._items.values()):
            raise ValueError(f"beat entry {beat.entry!r} is registered twice for cadence {self.cadence!r}")
        item = Scheduled(name, beat, modules, reads, writes, summary, files, sharded, self.cadence)
        self._items[name] = item
        return item

    def __iter__(self) -> Iterator[Scheduled]:
        return iter(list(self._items.values()))

    def __len__(self) -> int:
        return len(self._items)

    def names(self) -> list[str]:
        return list(self._items)
