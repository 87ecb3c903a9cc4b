"""Operations: what an admin or a researcher looks at while (or after) runs happen.

- `plots`: PNG charts (GPU allocation timeline, rho per policy, utilisation) drawn from plain
  data, so the same code serves a simulated run in memory and any run read back from the store.
- `runs`: the two thin adapters that turn a `SimResult` or a stored run into that plain data.
- `status`: the table of managed jobs (`shockslurm status`, `shocksub --status`), from one Slurm
  read and one store read.

Like `cli/`, this package may wire layers together (the store, the simulator, Slurm records);
nothing below it imports `ops`.
"""
