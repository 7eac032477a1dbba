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
  sending one worker task. An entry names its service function as text ("package.module:function", loaded
  when its task runs, so beat imports no analyzer), called ``fn(store, settings, **args)`` with the JSON-able
  arguments an operator re-runs it with; a sharded one also says how a shard of hosts runs (``Shards``).
  ``worker/tasks.py`` makes every entry's Celery task (and its shards') from the timetable.

Job analysis, the health sweep, beat's schedule, the worker's scheduled tasks, the API's ``GET
/api/v1/fleet/analyzers`` and ``fleetscope fleet analyzers`` all loop over these registries; adding an
analysis is its module in ``analyzers/`` plus one registered runner (a scheduled one: its service function
and its ``SCHEDULED.register``).
Order matters within a cadence: a runner may use what an earlier one left in the run's ``shared`` dict
(the health sweep's topology, say), so runners register in the order they run.
"""

from __future__ import annotations

import datetime as dt
import importlib
import re
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


_REF = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def _check_ref(ref: str, what: str) -> str:
    if not _REF.match(ref):
        raise ValueError(f"{what}: {ref!r} is not a function named as 'package.module:function'")
    return ref


def load(ref: str) -> Callable[..., Any]:
    """The function a "package.module:function" reference names, importing its module (a scheduled analysis'
    service loads when its task runs, not when beat starts)."""
    module, _, name = _check_ref(ref, "function").partition(":")
    return getattr(importlib.import_module(module), name)


def at(iso: str | None) -> dt.datetime:
    """A scheduled run's clock: the ``now_iso`` an operator re-runs it at, else now (UTC)."""
    return dt.datetime.fromisoformat(iso) if iso else dt.datetime.now(dt.UTC)


@dataclass(frozen=True)
class Shards:
    """How a sharded scheduled analysis runs when ``FLEETSCOPE_SWEEP_SHARDS`` > 1, each as "package.module:function":
    ``args(**args) -> dict`` fixes the run's arguments once (its window, from the clock) so that every shard and
    the fleet part see the same; ``run(store, settings, shard=, shards=, **args)`` is one shard of hosts' part,
    sent as Celery task ``task``; ``fleet(store, settings, **args)`` the part run once, in the entry's own task,
    after the shards are sent. ``run`` and ``fleet`` return JSON-able dicts."""

    task: str
    args: str
    run: str
    fleet: str


@dataclass(frozen=True)
class Scheduled:
    """One fleet analysis beat runs on a clock of its own: ``beat`` says which entry, task and when; ``run`` names
    the service function its task calls, ``fn(store, settings, **args) -> dict``, ``args`` being the JSON-able
    keyword arguments an operator re-runs it with (``now_iso``, ``window_start``/``window_end``, ``month``,
    ``window_s``); ``shards``, where set, how it splits over shards of hosts.
    ``files``: what it writes outside the database (the showback's reports), beside the tables in ``writes``."""

    name: str
    beat: Beat
    run: str
    modules: tuple[str, ...]
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    summary: str
    files: tuple[str, ...] = ()
    shards: Shards | None = None
    cadence: str = "scheduled"

    @property
    def sharded(self) -> bool:
        return self.shards is not None

    @property
    def tasks(self) -> tuple[str, ...]:
        """The Celery tasks it is run as: its beat entry's, then its shards'."""
        return (self.beat.task, *((self.shards.task,) if self.shards else ()))

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "cadence": self.cadence, "modules": list(self.modules), "reads": list(self.reads),
                "writes": list(self.writes), "needs": [], "sharded": self.sharded, "summary": self.summary}


class Timetable:
    """The scheduled analyses, in the order they are listed; a name, a beat entry and a task are each registered once."""

    def __init__(self, cadence: str = "scheduled"):
        self.cadence = cadence
        self._items: dict[str, Scheduled] = {}

    def register(self, name: str, *, beat: Beat, run: str, modules: tuple[str, ...], reads: tuple[str, ...],
                 writes: tuple[str, ...], summary: str, files: tuple[str, ...] = (), shards: Shards | None = None) -> Scheduled:
        if name in self._items:
            raise ValueError(f"analysis {name!r} is registered twice for cadence {self.cadence!r}")
        if any(a.beat.entry == beat.entry for a in self._items.values()):
            raise ValueError(f"beat entry {beat.entry!r} is registered twice for cadence {self.cadence!r}")
        item = Scheduled(name, beat, run, modules, reads, writes, summary, files, shards, self.cadence)
        taken = [t for a in self._items.values() for t in a.tasks]
        for task in item.tasks:
            if task in taken:
                raise ValueError(f"task {task!r} is registered twice for cadence {self.cadence!r}")
            taken.append(task)
        _check_ref(run, f"analysis {name!r}'s run")
        if shards is not None:
            for what in ("args", "run", "fleet"):
                _check_ref(getattr(shards, what), f"analysis {name!r}'s shards.{what}")
        self._items[name] = item
        return item

    def __iter__(self) -> Iterator[Scheduled]:
        return iter(list(self._items.values()))

    def __len__(self) -> int:
        return len(self._items)

    def names(self) -> list[str]:
        return list(self._items)
