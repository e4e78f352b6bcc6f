"""Slurm: `srun` taken over like ssh, and jobs that survive time limits.

- srun_args, srun_client, task: `srun ... CMD` run by a controlled tree
  starts CMD's tasks, detached, as `dmtcp-launch --join` trees on their
  nodes, and carries their stdio, signals and exit status over connections
  of its own (as DMTCP's rm_slurm plugin did), so that nothing in a
  checkpoint leads to slurmstepd.
- nodes, job, run: `dmtcp-slurm run -- CMD` in a job script: a coordinator
  per job, launch or restart from the newest generation on the new
  allocation's nodes, checkpoint and requeue on the time-limit signal.
"""
