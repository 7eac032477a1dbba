"""What every dashboard page shares: the store, cached queries, the sidebar's filters, formatting and charts.

Pages stay thin: they ask ``q(telemetry.fleet_size, ...)`` for a polars frame and draw it. All reads go
through the domain services' read functions (``fleetscope.services.*``, shared with the API and the CLI), cached
with a short TTL keyed on the database URL, the query and its arguments, so a page shared by many
viewers costs one query per TTL, and live panels still move.
"""

from __future__ import annotations

import datetime as dt
import functools
import importlib
import logging
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import altair as alt
import polars as pl
import streamlit as st
from sqlalchemy.engine import make_url
from streamlit.runtime.scriptrunner import add_script_run_ctx, get_script_run_ctx
from sqlalchemy.exc import SQLAlchemyError

from dashboard import signin
from dashboard.access import SESSION_KEY, Access
from dashboard.connection import _store, database_url, read_database_url, store, tell, told  # noqa: F401  (pages reach them as ui.*)
from fleetscope.services import job_reads as jobs_svc
from fleetscope.services import telemetry
from fleetscope.store import db
from fleetscope.store import reads_on_replica

# Live panels (latest samples, counts) re-query at most this often; history (ranges, per-job) less often;
# settled windows (whole hours in the past, whose data no longer changes) seldom.
LIVE_TTL_S = 15
HISTORY_TTL_S = 60
SETTLED_TTL_S = 6 * 3600

RANGES_S: dict[str, int] = {"15 min": 900, "1 h": 3600, "6 h": 21_600, "24 h": 86_400, "7 d": 604_800, "30 d": 2_592_000}
REFRESH_S: dict[str, int | None] = {"off": None, "10 s": 10, "30 s": 30, "60 s": 60}
ANCHORS = ("latest data", "now")
# Older than this, the sidebar says the data is stale: a live fleet scrapes every 10-60 s.
STALE_AFTER_S = 600

TIME_AXIS = "Time (UTC)"

log = logging.getLogger(__name__)


# --- the store and cached queries ------------------------------------------------------------------


def read(url: str, module: str, name: str, kwargs: tuple[tuple[str, Any], ...]) -> Any:
    """A page's read ``module.name(store, **kwargs)``, on the read replica where one is configured
    (FLEETSCOPE_READ_DATABASE_URL): a cached read is seconds old anyway, so a replica's lag costs nothing."""
    with reads_on_replica():
        return getattr(importlib.import_module(module), name)(_store(url, read_database_url()), **dict(kwargs))


@st.cache_data(ttl=LIVE_TTL_S, show_spinner=False, max_entries=1024)
def _live(url: str, module: str, name: str, kwargs: tuple[tuple[str, Any], ...]) -> Any:
    return read(url, module, name, kwargs)


@st.cache_data(ttl=HISTORY_TTL_S, show_spinner=False, max_entries=1024)
def _history(url: str, module: str, name: str, kwargs: tuple[tuple[str, Any], ...]) -> Any:
    return read(url, module, name, kwargs)


@st.cache_data(ttl=SETTLED_TTL_S, show_spinner=False, max_entries=4096)
def _settled(url: str, module: str, name: str, kwargs: tuple[tuple[str, Any], ...]) -> Any:
    return read(url, module, name, kwargs)


def q(fn: Callable[..., Any], *, live: bool = True, fresh: bool = False, settled: bool = False, **kwargs: Any) -> Any:
    """Run ``fn`` (a read of a ``fleetscope.services`` module) on the configured store, through the cache
    (``fresh``: around it, for small tables a page itself changes, so a change shows at once;
    ``settled``: kept for hours, for a window wholly in the past).

    A database that does not answer gets a clear error on the page instead of a traceback.
    """
    module = getattr(fn, "__module__", "") or ""
    if not module.startswith("fleetscope.services.") or getattr(importlib.import_module(module), fn.__name__, None) is not fn:
        raise ValueError(f"{getattr(fn, '__name__', fn)!r} is not a read of a fleetscope.services module")
    try:
        if fresh:
            return fn(store(), **kwargs)
        cache = _settled if settled else _live if live else _history
        return cache(database_url(), module, fn.__name__, tuple(sorted(kwargs.items())))
    except (SQLAlchemyError, sqlite3.Error) as exc:
        if getattr(_prefetching, "active", False):
            raise  # the page asks again and says it
        st.error(f"The database did not answer ({type(exc).__name__}): {str(exc).splitlines()[0][:300]}")
        st.stop()


_prefetching = threading.local()


def prefetch(*reads: Callable[[], Any]) -> None:
    """Run a page's independent reads (each a call of ``q``, or of a helper made of them) at once, and return when
    all are done, so the page then finds each in the cache as it draws: a first visit's reads are mostly the
    database's time, which PostgreSQL spends on several at once, where the page asks one after the other. A
    read that fails here is asked again by the page, which says why."""

    def run(read: Callable[[], Any]) -> None:
        _prefetching.active = True
        try:
            read()
        except BaseException:  # noqa: BLE001 - the page's own call reports it
            log.debug("prefetch failed", exc_info=True)

    ctx = get_script_run_ctx()
    threads = [threading.Thread(target=run, args=(read,), daemon=True) for read in reads]
    for thread in threads:
        if ctx is not None:
            add_script_run_ctx(thread, ctx)
        thread.start()
    for thread in threads:
        thread.join()


@st.cache_data(ttl=HISTORY_TTL_S, show_spinner=False)
def _schema_problem(url: str) -> tuple[bool, str] | None:
    """(whether the database was unreachable, what to tell), or None where it answers with the current schema."""

    try:
        engine = _store(url).engine
        current, head = db.current_revision(engine), db.head_revision(url)
    except (SQLAlchemyError, sqlite3.Error) as exc:
        shown = make_url(url).render_as_string(hide_password=True)
        return True, f"Cannot reach the database at {shown}: {str(exc).splitlines()[0][:300]}"
    if current != head:
        return False, f"The database schema is at {current or 'nothing'}, this version expects {head}: run `fleetscope db upgrade`."
    return None


def check_database(signed_in: bool = True) -> None:
    """Stop with a clear message where the database is unreachable or its schema is behind. Before sign-in
    (``signed_in=False``) an unreachable database is reported without its address or the driver's error,
    which go to the server's log instead."""
    problem = _schema_problem(database_url())
    if problem:
        unreachable, text = problem
        if unreachable and not signed_in:
            log.error("dashboard: %s", text)
            text = "The database does not answer, so nobody can sign in yet; the server's log says why."
        st.error(text)
        st.stop()


# --- who is signed in ---------------------------------------------------------------------------------


def access() -> Access:
    """The signed-in user of this run (``dashboard.signin.gate``, run by app.py before any page). A page
    reached without one draws nothing."""
    who = st.session_state.get(SESSION_KEY)
    if not isinstance(who, Access):
        st.stop()
    return who


def require(scope: str) -> Access:
    """The signed-in user, where they hold ``scope``; otherwise the page says which scope it needs and stops.
    app.py shows no page the user may not see, so this is the page's own guard behind the navigation's."""
    who = access()
    if not who.allows(scope):
        st.warning(who.why_not(scope))
        st.stop()
    return who


# --- filters -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Filters:
    """The sidebar's choices, as every page reads them."""

    start: dt.datetime
    end: dt.datetime
    range_s: int
    site: str | None
    job_id: str | None
    refresh_s: int | None
    anchor: str
    latest: dt.datetime | None


def _window_end(anchor: str) -> tuple[dt.datetime, dt.datetime | None]:
    latest = q(telemetry.data_end)
    if anchor == "latest data" and latest is not None:
        # One microsecond past the newest row: windows are half-open [start, end).
        return latest + dt.timedelta(microseconds=1), latest
    now = dt.datetime.now(dt.UTC)
    # Rounded up to 10 s so reruns within the same 10 s share cache entries.
    return now.replace(microsecond=0) + dt.timedelta(seconds=10 - now.second % 10), latest


# Filters travel in the URL too (?range=1 h&site=site-a&job=...), so a link from an alert or a chat
# opens the dashboard on the right job and window.
_URL_PARAMS = {"range": "f_range", "anchor": "f_anchor", "site": "f_site", "job": "f_job", "refresh": "f_refresh"}
_DEFAULTS = {"f_range": "24 h", "f_anchor": ANCHORS[0], "f_site": "All sites", "f_job": "All jobs", "f_refresh": "30 s"}


def _choice(key: str, options: list[str]) -> None:
    """Seed a filter widget's state: from the URL on a session's first run, else keep the user's choice;
    a choice no longer offered (a job outside the new time range) falls back to the default."""
    if key not in st.session_state:
        param = next(p for p, k in _URL_PARAMS.items() if k == key)
        st.session_state[key] = st.query_params.get(param, _DEFAULTS[key])
    if st.session_state[key] not in options:
        st.session_state[key] = _DEFAULTS[key]


def sidebar() -> Filters:
    """Draw the common controls (time range, site, job, refresh) and remember the choices."""
    sb = st.sidebar
    _choice("f_range", list(RANGES_S))
    range_label = sb.selectbox("Time range", list(RANGES_S), key="f_range")
    _choice("f_anchor", list(ANCHORS))
    anchor = sb.radio("Window ends at", ANCHORS, key="f_anchor", horizontal=True, help="'latest data' keeps a replayed or stalled database readable.")
    range_s = RANGES_S[range_label]
    end, latest = _window_end(anchor)
    start = end - dt.timedelta(seconds=range_s)
    site_rows = q(telemetry.sites, live=False)
    site_options = ["All sites", *site_rows["site_id"].drop_nulls().to_list()]
    _choice("f_site", site_options)
    site = sb.selectbox("Site", site_options, key="f_site")
    site = None if site == "All sites" else site
    job_rows = q(jobs_svc.jobs, live=False, start=start, end=end, site=site)
    job_options = ["All jobs", *job_rows["job_id"].to_list()]
    _choice("f_job", job_options)
    job = sb.selectbox("Job", job_options, key="f_job")
    _choice("f_refresh", list(REFRESH_S))
    refresh = sb.selectbox("Auto-refresh live panels", list(REFRESH_S), key="f_refresh")
    for param, key in _URL_PARAMS.items():
        value = st.session_state[key]
        if value == _DEFAULTS[key]:
            st.query_params.pop(param, None)
        else:
            st.query_params[param] = value
    if latest is None:
        sb.caption("No data yet: nothing has been ingested.")
    else:
        age_s = (dt.datetime.now(dt.UTC) - latest).total_seconds()
        sb.caption(f"Data as of {latest:%Y-%m-%d %H:%M:%S} UTC ({fmt_age(age_s)} ago)")
        if age_s > STALE_AFTER_S:
            sb.warning(f"The newest data is {fmt_age(age_s)} old: is ingest running?")
    f = Filters(start, end, range_s, site, None if job == "All jobs" else job, REFRESH_S[refresh], anchor, latest)
    st.session_state["_filters"] = f
    return f


def filters() -> Filters:
    """The filters the sidebar set on this run (pages are run after the sidebar, by app.py). Fleet pages
    call it first: it also stops a page whose user lacks the read scope."""
    require("read")
    f = st.session_state.get("_filters")
    if f is None:  # a page run on its own (tests of a single page): draw the sidebar here
        f = sidebar()
    return f


def live_end(f: Filters) -> dt.datetime:
    """The window's end, recomputed: inside an auto-refreshing fragment the sidebar does not rerun."""
    return _window_end(f.anchor)[0]


def live(body: Callable[[], None]) -> None:
    """Run ``body`` as a fragment that reruns on its own every refresh interval (or once, when off).

    A fragment's rerun skips app.py and so its sign-in gate: each one checks the session is still signed in
    with the same scopes, and otherwise reruns the whole app, whose gate then asks for a sign-in."""
    f = filters()
    if not f.refresh_s:
        body()
        return

    @functools.wraps(body)  # the fragment is known by its function's name: keep the page's own
    def checked() -> None:
        if not signin.unchanged():
            st.rerun()
        body()

    st.fragment(run_every=f.refresh_s)(checked)()


def pick_job(f: Filters, label: str = "Job", key: str = "page_job", require: Callable[[str], bool] | None = None) -> str | None:
    """The sidebar's job, or one picked on the page from the jobs in the window (running first)."""
    if f.job_id:
        return f.job_id
    df = q(jobs_svc.jobs, live=False, start=f.start, end=f.end, site=f.site)
    if df.is_empty():
        return None
    df = df.sort(pl.col("ended_at").is_not_null(), pl.col("started_at"), descending=[False, True], nulls_last=True)
    ids = df["job_id"].to_list()
    return st.selectbox(label, ids, key=key)


# --- fleet series ------------------------------------------------------------------------------------

# Whole steps older than this are settled: the samples of their instant have arrived.
SETTLE = dt.timedelta(minutes=5)
GRID_BLOCK = 16
"""Settled instants of a fleet series read (and cached) together."""


def fleet_series(f: Filters) -> pl.DataFrame:
    """The fleet's power and busy GPUs at instants on a fixed grid over the range (about 48), and now.

    Each instant is one probe (``telemetry.fleet_series_at``) of the tier the whole range reads
    (``telemetry.series_tier``: the hour tier for 30 days, raw samples for an hour), so a long range never
    probes raw samples, whose closed days may be packed; settled instants' probes are kept for hours, so a day
    of a 16k-GPU fleet costs one new probe per grid step instead of 48 per visit."""
    first = q(telemetry.series_start, live=False, range_s=f.range_s)
    if first is None or f.end <= first:
        return pl.DataFrame()
    start = max(f.start, first)
    span_s = int((f.end - start).total_seconds())
    step = bucket_for(span_s)
    tier = q(telemetry.series_tier, live=False, range_s=max(span_s, step))
    # the sample interval measured once for the range, not at both ends of every probe
    probe_s = q(telemetry.raw_probe_s, live=False, start=start, end=f.end)
    settled = []
    at = dt.datetime.fromtimestamp((int(start.timestamp()) // step + 1) * step, dt.UTC)
    while at < f.end - SETTLE:
        settled.append(at)
        at += dt.timedelta(seconds=step)
    # settled instants in fixed blocks of the grid, one statement and one cache entry a block: a new instant
    # settling re-reads its block only
    blocks: dict[int, list[dt.datetime]] = {}
    for at in settled:
        blocks.setdefault(int(at.timestamp()) // step // GRID_BLOCK, []).append(at)
    parts = [q(telemetry.fleet_series_at, settled=True, instants=tuple(b), site=f.site, tier=tier, probe_s=probe_s) for b in blocks.values()]
    parts.append(q(telemetry.fleet_series_at, live=False, instants=(f.end,), site=f.site, tier=tier, probe_s=probe_s))
    parts = [p for p in parts if p.height]
    return pl.concat(parts).sort("ts") if parts else pl.DataFrame()


# --- empty states ------------------------------------------------------------------------------------


def no_data(what: str, later: str | None = None) -> None:
    """The one way a page says there is nothing to show: never an exception, never a blank."""
    text = f"No data yet: {what}"
    if later:
        text += f" {later}"
    st.info(text, icon=":material/hourglass_empty:")


# --- actions ----------------------------------------------------------------------------------------


# --- formatting ----------------------------------------------------------------------------------


def utc_column(label: str, seconds: bool = True) -> Any:
    """A table column of UTC times, labelled so."""
    return st.column_config.DatetimeColumn(f"{label} (UTC)", format="YYYY-MM-DD HH:mm:ss" if seconds else "YYYY-MM-DD HH:mm")



def fmt_age(seconds: float) -> str:
    s = abs(seconds)
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    if s < 172_800:
        return f"{s / 3600:.1f} h"
    return f"{s / 86_400:.1f} d"


def fmt_power(w: float | None) -> str:
    if w is None:
        return "—"
    if w >= 1e6:
        return f"{w / 1e6:.2f} MW"
    if w >= 1e3:
        return f"{w / 1e3:.1f} kW"
    return f"{w:.0f} W"


def fmt_energy(j: float | None) -> str:
    if j is None:
        return "—"
    kwh = j / 3.6e6
    if kwh >= 1000:
        return f"{kwh / 1000:.2f} MWh"
    return f"{kwh:.1f} kWh"


def fmt_duration(s: float | None) -> str:
    if s is None:
        return "—"
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 120:
        return f"{s:.2f} s"
    return fmt_age(s)


def bucket_for(range_s: int, buckets: int = 48) -> int:
    """A round time bucket giving about ``buckets`` bars over the range."""
    for b in (60, 300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 86_400):
        if range_s / b <= buckets:
            return b
    return 86_400


# --- charts ---------------------------------------------------------------------------------------


def chart(c: alt.Chart | alt.LayerChart, height: int = 280) -> None:
    st.altair_chart(c.properties(height=height), width="stretch")


def time_x(field: str = "ts") -> alt.X:
    return alt.X(f"{field}:T", title=TIME_AXIS, axis=alt.Axis(format="%H:%M", labelOverlap=True))


def stacked_parts(df: pl.DataFrame, x: str, parts: dict[str, str], x_enc: Any, y_title: str) -> alt.Chart:
    """A stacked bar of ``parts`` (column → legend label) along ``x``: how a whole splits into parts."""
    long = df.select(x, *parts).unpivot(index=x, variable_name="part", value_name="value").with_columns(
        pl.col("part").replace_strict(parts, return_dtype=pl.String)
    )
    return (
        alt.Chart(long)
        .mark_bar()
        .encode(
            x=x_enc,
            y=alt.Y("sum(value):Q", title=y_title, stack="zero"),
            color=alt.Color("part:N", title=None, sort=list(parts.values()), legend=alt.Legend(orient="bottom")),
            order=alt.Order("part_order:Q"),
            tooltip=[alt.Tooltip(f"{x}", title=x), "part:N", alt.Tooltip("value:Q", format=".3f", title=y_title)],
        )
        .transform_calculate(part_order=" + ".join(f"(datum.part == {label!r} ? {i} : 0)" for i, label in enumerate(parts.values())))
    )
