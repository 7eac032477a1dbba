"""The ingest door in process, round by round: what an agent's push costs the writer and the database when
its node is new (round 1) and when the service knows it (the rounds after).

The pushes of ``benchmarks/ingest_agents.py`` (hosts x 8 GPUs x 30 DCGM fields, as dcgm-exporter text or as
OTLP protobuf), made ready as the API makes them on arrival (``ingestion.to_push`` and the line reader for
dcgm, the OTLP route's template lookup or decode for OTLP) and handed to a ``fleetscope.door.Door`` over a
fresh store, ``--group`` at a time (the groups 16 agents' connections make). No HTTP, no event loop: the
figures are the door's and the store's own, CPU seconds of this process (arrival work and the writer) and
of PostgreSQL's backends, a push. One JSON line per database, body and round.

    python benchmarks/ingest_door.py [--hosts 1024] [--rounds 3] [--group 16] [--no-sqlite] [--no-postgres]
                                     [--only dcgm|otlp] [--profile ROUND]

``--profile ROUND``: cProfile that round (the writer thread and the arrival work) and print its top
functions by own time to stderr.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import cProfile
import datetime as dt
import gzip
import io
import json
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from fleetscope import door  # noqa: E402
from fleetscope.api import routes_otlp  # noqa: E402
from fleetscope.door import ingestion, screen  # noqa: E402
from fleetscope import settings  # noqa: E402
from fleetscope.store import db  # noqa: E402
from ingest import otlp_template  # noqa: E402
from ingest.format import Options  # noqa: E402

from benchmarks import _server  # noqa: E402

_load = _server.sibling

_dcgm = _load("ingest_dcgm")
_otlp = _load("ingest_otlp")

T0 = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)
LIMIT = 64 * 2**20


def _dcgm_push(body: bytes, host: int, when: dt.datetime) -> screen.Push:
    push = ingestion.to_push(body, source=f"agent-{host}", fmt="dcgm", opts=Options(ts=when), now=when, formats=["dcgm"])
    screen.read_lines(push)
    return push


def _otlp_push(body: bytes) -> screen.Push:
    found, inflated = routes_otlp._from_template(body, True, LIMIT, "protobuf")
    walk, sha = found if found is not None else routes_otlp._decode(inflated or body, inflated is None, LIMIT, "protobuf", looked_up=inflated is not None, received=body)
    return screen.Push("otlp:/v1/metrics", sha, ["otlp"], otlp=walk, nbytes=len(body))


def run(label: str, url: str, kind: str, args: argparse.Namespace) -> None:
    bodies: list[bytes]
    if kind == "dcgm":
        bodies = [_dcgm.agent_body(h) for h in range(args.hosts)]
    # a fresh process's memory of nodes: the templates are the process's, not the store's
    for module in ("ingest.dcgm_lines", "ingest.dcgm_labels"):
        for memory in ("_TEMPLATES", "_SKELETONS", "_BLOCKS"):
            getattr(sys.modules.get(module), memory, {}).clear()
    otlp_template.clear()
    with _server.migrated_store(url) as store:
        # as the API makes its door and store (api.app), with the default settings
        d = door.Door(store, window_s=0.002, max_future_skew_s=settings.load().max_future_skew_s)
        store.checkpoint_in_background()
        watch = _server.CpuWatch(f" {url.rsplit('/', 1)[1]} ") if label == "postgresql" else None
        try:
            for r in range(args.rounds):
                when = T0 + dt.timedelta(seconds=10 * r)
                if kind == "otlp":
                    ts_ns = int(when.timestamp()) * 10**9
                    bodies = [gzip.compress(_otlp.build_request(8, ts_ns, first=8 * h), compresslevel=1) for h in range(args.hosts)]
                prof = cProfile.Profile() if args.profile == r + 1 else None
                writer_prof: list[cProfile.Profile] = []
                if prof is not None:
                    writer_prof = _profile_writer(d)
                pg0 = watch.sample() if watch else 0.0
                c0, t0 = time.process_time(), time.perf_counter()
                if prof is not None:
                    prof.enable()
                sizes = []
                for i in range(0, args.hosts, args.group):
                    pushes = [(_dcgm_push(bodies[h], h, when) if kind == "dcgm" else _otlp_push(bodies[h])) for h in range(i, min(i + args.group, args.hosts))]
                    futs = [d.submit(p) for p in pushes]
                    for f in cf.as_completed(futs):
                        sizes.append(f.result().group_size)
                if prof is not None:
                    prof.disable()
                    del d._commit  # the class's own again
                seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
                pg = (watch.sample() - pg0) if watch else None
                line = {"bench": "ingest_door", "db": label, "body": kind, "round": r + 1, "hosts": args.hosts, "group": args.group,
                        "mean_group": round(sum(sizes) / len(sizes), 1), "seconds": round(seconds, 3),
                        "process_cpu_ms_per_push": round(cpu * 1e3 / args.hosts, 3)}
                if pg is not None:
                    line["postgres_cpu_ms_per_push"] = round(pg * 1e3 / args.hosts, 3)
                line["load_avg_1m"] = os.getloadavg()[0]
                print(json.dumps(line), flush=True)
                if prof is not None:
                    _print_profile([prof, *writer_prof], f"{label} {kind} round {r + 1}", args.top)
        finally:
            d.close()
            store.stop_checkpointing()
            if watch is not None:
                watch.close()


def _profile_writer(d: door.Door) -> list[cProfile.Profile]:
    """Profile the door's writer thread: its ``_commit`` is wrapped, as an attribute of the instance, until
    the caller deletes it."""
    profs: list[cProfile.Profile] = []
    inner = type(d)._commit

    def commit(group: Any) -> None:
        prof = cProfile.Profile()
        profs.append(prof)
        prof.enable()
        try:
            inner(d, group)
        finally:
            prof.disable()

    d._commit = commit  # type: ignore[method-assign]
    return profs


def _print_profile(profs: list[cProfile.Profile], title: str, top: int) -> None:
    out = io.StringIO()
    st = pstats.Stats(profs[0], stream=out)
    for p in profs[1:]:
        st.add(p)
    print(f"=== profile: {title} (this thread + writer) ===", file=out)
    st.sort_stats("tottime").print_stats(top)
    st.sort_stats("cumulative").print_stats(top)
    sys.stderr.write(out.getvalue())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--group", type=int, default=16)
    ap.add_argument("--no-postgres", action="store_true")
    ap.add_argument("--no-sqlite", action="store_true")
    ap.add_argument("--only", choices=("dcgm", "otlp"))
    ap.add_argument("--profile", type=int, default=0, help="cProfile this round (1 = every node new)")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    kinds = [k for k in ("dcgm", "otlp") if not args.only or k == args.only]
    for kind in kinds:
        if not args.no_sqlite:
            run("sqlite", f"sqlite:///{tempfile.mkdtemp(prefix='fleetscope-door-')}/fleetscope.store.db", kind, args)
        if not args.no_postgres:
            base = os.environ.get("FLEETSCOPE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
            with db.scratch_database(base, "fleetscope_bench_door") as url:
                run("postgresql", url, kind, args)


if __name__ == "__main__":
    main()
