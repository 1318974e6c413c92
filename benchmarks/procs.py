"""The 4-consumer drain: spawned processes (``multiprocessing`` spawn), started once per
benchmark run and reused for every repetition and both sides, so process start-up and
imports are never timed. Each process holds its own engine/Store (library side) or its own
driver connection (floor side); all of them start draining together at a barrier, and
throughput is jobs / (last finish - first start) on the system-wide monotonic clock."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import time
import traceback
from typing import Any

RECV_TIMEOUT_S = 600.0


class ProcPool:
    def __init__(self, nprocs: int = 4) -> None:
        ctx = mp.get_context("spawn")
        self.nprocs = nprocs
        self.barrier = ctx.Barrier(nprocs + 1)
        self.pipes: list[Any] = []
        self.procs: list[Any] = []
        for i in range(nprocs):
            parent_end, child_end = ctx.Pipe()
            proc = ctx.Process(target=child_main, args=(child_end, self.barrier, i),
                               name=f"bench-consumer-{i}", daemon=True)
            proc.start()
            child_end.close()
            self.pipes.append(parent_end)
            self.procs.append(proc)

    def _ask_all(self, msg: Any, expect: str) -> list[Any]:
        for pipe in self.pipes:
            pipe.send(msg)
        return [self._recv(pipe, expect) for pipe in self.pipes]

    def _recv(self, pipe: Any, expect: str) -> Any:
        if not pipe.poll(RECV_TIMEOUT_S):
            self._fail("a consumer process did not answer in time")
        kind, value = pipe.recv()
        if kind != expect:
            self._fail(f"a consumer process failed:\n{value}")
        return value

    def _fail(self, message: str) -> None:
        self.barrier.abort()
        self.close(force=True)
        raise RuntimeError(message)

    def setup(self, spec: dict[str, Any]) -> None:
        """Point every process at one engine's database (closing what it held before)."""
        self._ask_all(("setup", spec), "ok")

    def teardown(self) -> None:
        self._ask_all(("teardown", None), "ok")

    def run(self, job: dict[str, Any]) -> tuple[int, float]:
        """All processes drain the queue together; returns (jobs, seconds)."""
        self._ask_all(("run", job), "ready")
        self.barrier.wait()
        results = [self._recv(pipe, "done") for pipe in self.pipes]
        done = sum(r[0] for r in results)
        start = min(r[1] for r in results)
        end = max(r[2] for r in results)
        return done, end - start

    def close(self, force: bool = False) -> None:
        for pipe, proc in zip(self.pipes, self.procs, strict=True):
            if not force and proc.is_alive():
                with contextlib.suppress(OSError):
                    pipe.send(None)
        for proc in self.procs:
            proc.join(0 if force else 10)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
        for pipe in self.pipes:
            pipe.close()
        self.pipes, self.procs = [], []


class _Resources:
    """What one consumer process holds for the current engine."""

    def __init__(self, spec: dict[str, Any]) -> None:
        import sqlalchemy as sa

        import alkstore_sa as alk
        from benchmarks.env import raw_connect
        from benchmarks.floor import FloorSQL

        self.spec = spec
        self.engine = sa.create_engine(spec["url"])
        self.store = alk.Store(self.engine, schema=spec["schema"])
        self.conn = raw_connect(spec["kind"], spec["floor_path"], spec["dsn"])
        self.sql = FloorSQL(spec["kind"], spec["floor"])
        # warm both sides (statement compilation, connections) on an empty queue
        self.store.queue("bench-warm").claim_batch("warm", 10)
        self.conn.execute(self.sql.claim, self.sql.claim_params("bench-warm", 10, "warm")).fetchall()

    def close(self) -> None:
        self.conn.close()
        self.store.close()
        self.engine.dispose()


def child_main(pipe: Any, barrier: Any, index: int) -> None:
    from benchmarks import floor, workloads

    res: _Resources | None = None
    while True:
        msg = pipe.recv()
        if msg is None:
            break
        op, arg = msg
        try:
            if op == "setup":
                if res is not None:
                    res.close()
                res = _Resources(arg)
                pipe.send(("ok", None))
            elif op == "teardown":
                if res is not None:
                    res.close()
                    res = None
                pipe.send(("ok", None))
            elif op == "run":
                assert res is not None
                worker = f"bench-proc-{index}"
                q = res.store.queue(arg["queue"])
                pipe.send(("ready", None))
                barrier.wait()
                t0 = time.monotonic()
                if arg["side"] == "alk":
                    n = workloads.drain(q, arg["batch"], worker)
                else:
                    n = floor.drain(res.conn, res.sql, arg["queue"], arg["batch"], worker)
                pipe.send(("done", (n, t0, time.monotonic())))
            else:
                raise ValueError(op)
        except BaseException:
            pipe.send(("error", traceback.format_exc()))
            if op == "run":
                break
    if res is not None:
        res.close()
