"""Multi-process concurrency tests: several OS processes (spawned, each with its own Store
and engine) against one real database, on both engines."""
