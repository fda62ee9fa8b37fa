"""Default schedules (no tuning) per target family and kernel kind: the shared schedule helpers (rules.py),
one module per kernel kind (matmul, conv, depthwise, int8, AMX, Winograd, rows, recurrence, dynamic, GPU),
the registry that picks a rule (registry.py, kinds.py) and the pass that applies it (apply.py).
Import the modules themselves; the package imports nothing (see kiln/schedules/__init__.py)."""
