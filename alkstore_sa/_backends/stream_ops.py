"""Streams: commit-ordered offsets, reads, consumer offsets, trimming."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from ..schema import stream_events, stream_offsets, streams
from .core import Core
from .sql import ONE, Executor, bp


class StreamOps(Core):
    """Streams: commit-ordered offsets, reads, consumer offsets, trimming."""

    # -- streams ---------------------------------------------------------------------------

    def _next_offset(self) -> Any:
        """Increment the stream's counter (created at 1), returning the new offset; the row
        lock it takes is held until the publishing transaction ends."""
        ins = self.upsert(streams).values(name=bp("stream", sa.Text), last_offset=ONE)
        return ins.on_conflict_do_update(
            index_elements=[streams.c.name], set_={"last_offset": streams.c.last_offset + ONE}
        ).returning(streams.c.last_offset)

    @abc.abstractmethod
    def stream_publish(self, ex: Executor, params: Mapping[str, Any]) -> int:
        """Append ``:payload`` to ``:stream`` at the next offset (commit-ordered); the offset."""

    def stream_read(self, ex: Executor, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        def build() -> sa.Executable:
            e = stream_events
            stmt = (
                sa.select(e.c.offset, e.c.payload, e.c.created_at)
                .where(e.c.stream == bp("stream", sa.Text), e.c.offset > bp("after", sa.BigInteger))
                .order_by(e.c.offset)
            )
            return self.limit(stmt, "limit")

        return ex.rows(self.sql("stream_read", build), params)

    def stream_commit(self, ex: Executor, params: Mapping[str, Any]) -> None:
        def build() -> sa.Executable:
            ins = self.upsert(stream_offsets).values(
                stream=bp("stream", sa.Text),
                consumer=bp("consumer", sa.Text),
                offset=bp("offset", sa.BigInteger),
                updated_at=self.now(),
            )
            return ins.on_conflict_do_update(
                index_elements=[stream_offsets.c.stream, stream_offsets.c.consumer],
                set_={"offset": ins.excluded.offset, "updated_at": ins.excluded.updated_at},
            )

        ex.rowcount(self.sql("stream_commit", build), params)

    def stream_offset(self, ex: Executor, params: Mapping[str, Any]) -> int:
        sql = self.sql(
            "stream_offset",
            lambda: sa.select(stream_offsets.c.offset).where(
                stream_offsets.c.stream == bp("stream", sa.Text),
                stream_offsets.c.consumer == bp("consumer", sa.Text),
            ),
        )
        rows = ex.rows(sql, params)
        return _committed(rows[0][0]) if rows else 0

    def stream_trim(self, ex: Executor, params: Mapping[str, Any]) -> int:
        sql = self.sql(
            "stream_trim",
            lambda: sa.delete(stream_events).where(
                stream_events.c.stream == bp("stream", sa.Text),
                stream_events.c.offset <= bp("offset", sa.BigInteger),
            ),
        )
        return ex.rowcount(sql, params)

    def stream_offsets(self, ex: Executor, params: Mapping[str, Any]) -> dict[str, int]:
        """Last offset of every stream (the dashboard)."""
        sql = self.sql("stream_offsets", lambda: sa.select(streams.c.name, streams.c.last_offset))
        return {name: int(last) for name, last in ex.rows(sql, params)}


def _committed(stored: Any) -> int:
    """A consumer's committed offset as stored. SQLite keeps the text (or an infinity) an
    UPDATE puts in the column, and ``int()`` of it raised out of ``offset()`` and so out of
    every ``subscribe()`` of the consumer, which could not start again. One that names no
    offset reads as 0: the consumer reads from the start (at least once), and its next
    ``commit`` writes a real one."""
    try:
        return int(stored)
    except (TypeError, ValueError, OverflowError):
        return 0
