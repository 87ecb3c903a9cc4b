"""What differs between the Slurm versions the project runs live, each named after the first
version here that needs it (verified with `bash docker/versions.sh VERSION`, README "Slurm
versions"). Versions not named behave as 22.05 does.

- 22.05.8 (Debian 12): `squeue --json` ignores every filter (-j, -t, -u, -n) and lists every job
  slurmctld still knows, finished ones included (until MinJobAge).
- 24.11.5 (Debian 13) and 26.05.5 (Debian sid): `squeue --json` honours the state filter, and its
  default leaves finished jobs (COMPLETED, CANCELLED, FAILED, ...) out: the daemon would see a
  finished job vanish instead of its end state, and `shockslurm status` would list none. Asking
  for every state gives 22.05's list on each version (22.05 takes the option and ignores it).
"""

from __future__ import annotations

# squeue's options for "every job, finished ones included" (needed from 24.11; harmless on 22.05)
SQUEUE_ALL_STATES_24_11: tuple[str, ...] = ("--states=all",)
