"""Benchmarks: alkstore_sa side by side with a raw-driver floor, measured in the same run.

Run ``python -m benchmarks`` (or ``make bench``); ``python -m benchmarks --help`` lists the
options. Every workload is measured on the library and on a floor written with the plain
driver (psycopg 3 / sqlite3) against a minimal table with the same columns, doing the same
durable work (same number of transactions, same commit mode); the table reports medians
over the repetitions and the ratio library / floor, which is what to compare across runs
on a noisy machine.

Modules: ``env`` (the database per engine), ``floor`` (the raw-driver side),
``workloads`` (the alkstore side and the workload list), ``procs`` (the 4-process drain),
``scaling`` (drain throughput against a growing table), ``report`` (table and JSON),
``cli`` (the entry point).
"""
