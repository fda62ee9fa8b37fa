"""A build function for the build worker that imports nothing at module level, so the worker's own
start-up decides what it has loaded (test_build_worker.py)."""


def loaded_modules(mod_json, target, out_dir):
    import sys

    return ",".join(m for m in ("torch", "tvm", "kiln.schedules.rules.rules") if sys.modules.get(m) is not None)
