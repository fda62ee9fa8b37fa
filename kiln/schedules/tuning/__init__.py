"""`kiln tune`: MetaSchedule search on Kiln's kernels (tuning.py; on remote devices: rpc.py), its build worker
and runner (builder.py, build_worker.py, workers.py, measure_args.py), the defaults measured as baselines
(baseline.py), the tuning database (database.py) and the shipped records a compile may use (shipped.py). The
package imports nothing: the build worker starts in a fresh process inside --budget (build_worker.py)."""
