"""Shards of the fleet for the sweeps beat splits across workers (``FLEETSCOPE_SWEEP_SHARDS``): the energy roll-up
(``services.energy_rollup.rollup_shard``) and the health sweep (``services.health.health_window(part=...)``).

A shard is a group of hosts: host h belongs to shard crc32(h) mod n, so a host keeps its shard as others come
and go and shards stay near equal in size; a GPU belongs to its host's shard, and GPUs the inventory places on
no host to shard 0. Whole hosts stay together, so per-node figures (a node's health, its GPUs' shares) come
out of one shard.
"""

from __future__ import annotations

import datetime as dt
import zlib

import polars as pl

from fleetscope.store import Store
from fleetscope.store.reads import gpu_samples_sql


def shard_of(host: str, shards: int) -> int:
    return zlib.crc32(host.encode()) % shards


def shard_hosts(store: Store, shard: int, shards: int) -> list[str]:
    """The hosts of ``shard`` of ``shards`` (from the host and GPU inventories), sorted."""
    if not (0 <= shard < shards):
        raise ValueError(f"shard {shard} is not one of 0..{shards - 1}")
    hosts = store.read("host", columns=["host"])["host"].to_list() + store.read("gpu", columns=["host"])["host"].drop_nulls().to_list()
    return sorted(h for h in set(hosts) if shard_of(h, shards) == shard)


def shard_gpu_samples(store: Store, shard: int, shards: int, start: dt.datetime, end: dt.datetime,
                      columns: list[str], schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """``columns`` of the ``gpu_sample`` rows in [start, end) of the GPUs on ``shard``'s hosts, ordered by GPU
    and time as ``Store.read`` orders them."""
    hosts = shard_hosts(store, shard, shards)
    clauses = ([f"g.host IN ({', '.join('?' * len(hosts))})"] if hosts else []) + (["g.host IS NULL"] if shard == 0 else [])
    if not clauses:
        return pl.DataFrame(schema={c: schema[c] for c in columns})
    sql = (f"SELECT {', '.join('s.' + c for c in columns)} FROM {gpu_samples_sql(store, start, end, columns, 's')} LEFT JOIN gpu g ON g.gpu_uuid = s.gpu_uuid"
           f" WHERE {' OR '.join(clauses)} ORDER BY s.gpu_uuid, s.ts")
    return store.query(sql, hosts, {c: schema[c] for c in columns}).select(columns)


def in_shard(store: Store, df: pl.DataFrame, shard: int, shards: int) -> pl.DataFrame:
    """The rows of ``df`` (with ``gpu_uuid``) whose GPU is on ``shard``'s hosts (on no known host: shard 0)."""
    if df.height == 0:
        return df
    placed = store.read("gpu", columns=["gpu_uuid", "host"]).filter(pl.col("host").is_not_null())
    mine = placed.filter(pl.col("host").is_in(shard_hosts(store, shard, shards)))["gpu_uuid"]
    keep = pl.col("gpu_uuid").is_in(mine.implode()) | (~pl.col("gpu_uuid").is_in(placed["gpu_uuid"].implode()) & pl.lit(shard == 0))
    return df.filter(keep)
