"""`shockslurm bench live`: replay a workload on a real Slurm cluster, arm after arm.

An arm is `native` (plain sbatch on a partition the plugin leaves alone, no hold: Slurm's own
scheduling) or a policy run by the real daemon (`shockslurm daemon --config ...` as a
subprocess, jobs submitted with `shocksub`). Every job is the stand-in training job
(`standin`), which follows its spec's per-epoch durations and batch sizes (time-scaled),
reports through the training helper's `Reporter` into the daemon's spool and checkpoints its
position on USR1.

- `workload`: the built-in default workload, time scaling, the stand-in's per-job plans;
- `timeline`: pure arithmetic on the `squeue --json` poll timeline (runs, JCT, rho,
  utilisation, idle GPU-seconds, switch costs), unit-tested;
- `standin`: the stand-in job (no torch);
- `arms`: running one arm (submission, watcher, daemon subprocess, clean-up);
- `report`: the simulator's prediction for the same workload and the side-by-side table;
- `repeats`: each arm's medians over repeated runs, and its ratios to native paired by repeat;
- `family`: `bench live-family`, the default workload over many seeds, each arm simulated and
  its ratios to native summarised over the seeds.
"""
