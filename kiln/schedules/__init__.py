"""The schedules of a model's kernels, in three parts:

- `rules/`: the default schedules (no tuning needed), one rule per target family and kernel kind, chosen by
  the registry (rules/registry.py) and applied by ApplyDefaultSchedules (rules/apply.py);
- `tuning/`: `kiln tune` (MetaSchedule search, its build worker and runner, the tuning database and the
  shipped records a compile may use);
- `kernels/`: Kiln's C kernels, compiled and linked into the artifact.

Nothing is imported with the package: `kiln tune`'s build worker imports kiln.schedules.tuning.build_worker
in a fresh process, and the rules' import (the int8 tensor intrinsics, parsed from TVMScript) would add
seconds to every worker start, inside the --budget."""
