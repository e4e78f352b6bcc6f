"""The pure parts of the Slurm support: srun's command line as dmtcp-srun
reads and rewrites it, where a requeued job's trees go, and what
dmtcp-slurm run does on each event."""
from __future__ import annotations

import pytest

from dmtcp_py.slurm import job, nodes, srun_args
from dmtcp_py.slurm.srun_args import SrunUsageError, parse

TASK = srun_args.TaskLaunch(setsid="/usr/bin/setsid", launch="/v/dmtcp-launch", python="/v/python",
                            coord_host="198.18.0.1", coord_port=7779, ckptdir="/ck",
                            port=4000, cookie="c0")


# ---- srun's command line ---------------------------------------------------

def test_open_mpi_plm_slurm_line():
    # as Open MPI 4.1's mpirun calls it inside an allocation (seen here)
    args = ["--ntasks-per-node=1", "--kill-on-bad-exit", "--mpi=none", "--nodes=1",
            "--nodelist=h2", "--ntasks=1", "orted", "-mca", "ess", '"slurm"']
    call = parse(args)
    assert call.options == args[:6]
    assert call.command == ["orted", "-mca", "ess", '"slurm"']
    assert call.kill_on_bad_exit


def test_mpich_hydra_line():
    # MPICH 4.0's hydra, bootstrap slurm: options with separate arguments
    args = ["-N", "2", "-n", "2", "--input", "none", "/usr/bin/hydra_pmi_proxy",
            "--control-port", "h1:42277", "--proxy-id", "-1"]
    call = parse(args)
    assert call.options == args[:6]
    assert call.command == args[6:]
    assert not call.kill_on_bad_exit


@pytest.mark.parametrize("args,command", [
    (["-N2", "hostname"], ["hostname"]),
    (["-lN", "2", "hostname", "-N", "3"], ["hostname", "-N", "3"]),
    (["--", "-weird"], ["-weird"]),
    (["-K0", "a"], ["a"]),
    (["-w", "h1,h2", "--export=ALL", "a", "b"], ["a", "b"]),
])
def test_command_is_found(args, command):
    assert parse(args).command == command


@pytest.mark.parametrize("args", [
    ["--help"], ["--version"], ["-V"], ["--pty", "bash"], ["--multi-prog", "conf"],
    ["-N2"], [], ["--usage"],
])
def test_not_a_launch(args):
    assert parse(args) is None


def test_kill_on_bad_exit_forms():
    assert parse(["-K", "a"]).kill_on_bad_exit
    assert parse(["--kill-on-bad-exit=1", "a"]).kill_on_bad_exit
    assert not parse(["--kill-on-bad-exit=0", "a"]).kill_on_bad_exit
    assert not parse(["-K0", "a"]).kill_on_bad_exit
    assert parse(["-K1", "-N2", "a"]).kill_on_bad_exit


def test_missing_argument_is_an_error():
    with pytest.raises(SrunUsageError, match="--nodelist"):
        parse(["--nodelist"])
    with pytest.raises(SrunUsageError, match="-w"):
        parse(["-w"])


def test_export_drops_the_shim_and_the_agent():
    env = ["PATH", "LD_PRELOAD", "DMTCP_AGENT_SOCK", "DMTCP_SRUN_DIRECT", "OMPI_X",
           "DMTCP_COORD_TOKEN", "BAD,NAME"]
    value = srun_args.export_value(parse(["a"]), env)
    assert value.split(",") == ["DMTCP_COORD_TOKEN", "OMPI_X", "PATH"]
    value = srun_args.export_value(parse(["--export=ALL,X=1", "a"]), env)
    assert value.endswith(",X=1") and "LD_PRELOAD" not in value
    assert srun_args.export_value(parse(["--export=NONE", "a"]), env) == "DMTCP_COORD_TOKEN"
    assert srun_args.export_value(parse(["--export=A,LD_PRELOAD=x", "a"]), env) \
        == "A,DMTCP_COORD_TOKEN"


def test_real_srun_line():
    call = parse(["--nodes=1", "--export", "ALL", "orted", "-x"])
    argv = srun_args.srun_argv("/usr/bin/srun", call, TASK, "PATH")
    assert argv[:4] == ["/usr/bin/srun", "--nodes=1", "--export", "PATH"]
    i = argv.index("/bin/sh")
    assert argv[i + 1] == "-c" and argv[i + 3] == "/usr/bin/setsid"
    assert argv[i + 4:i + 10] == ["/v/dmtcp-launch", "--join", "-h", "198.18.0.1", "-p", "7779"]
    assert argv[-3:] == ["--", "orted", "-x"]
    plain = srun_args.srun_argv("srun", parse(["a"]), TASK, "PATH")
    assert plain[1] == "--export=PATH"


# ---- where the trees go ------------------------------------------------------

SCRIPT = """#!/bin/bash
restart_on h1 /ck/ckpt_mpirun_1.dmtcp &
pids+=($!)
restart_on h2 /ck/ckpt_python3_2.dmtcp /ck/ckpt_x_3.dmtcp &
"""


def test_hosts_in_script():
    assert nodes.hosts_in_script(SCRIPT) == ["h1", "h2"]
    assert nodes.hosts_in_script("restart_on 'h 1' /a\n") == ["h 1"]
    assert nodes.images_in_script(SCRIPT) == 3


def test_same_nodes_stay():
    assert nodes.place(["h1", "h2"], "h1", ["h1", "h2"], "h1") == {"h1": "h1", "h2": "h2"}


def test_a_drained_node_is_replaced():
    assert nodes.place(["h1", "h2"], "h1", ["h1", "h3"], "h1") == {"h1": "h1", "h2": "h3"}


def test_head_moves_to_the_new_head():
    # h1 is gone; the job script now runs on h2
    assert nodes.place(["h1", "h2"], "h1", ["h2", "h3"], "h2") == {"h1": "h2", "h2": "h3"}


def test_more_hosts_than_nodes_share():
    got = nodes.place(["h1", "h2", "h3"], "h1", ["h4", "h5"], "h4")
    assert got == {"h1": "h4", "h2": "h5", "h3": "h5"}
    assert nodes.place(["h1", "h2"], "h1", ["h4"], "h4") == {"h1": "h4", "h2": "h4"}


def test_unknown_head():
    assert nodes.place(["h1", "h2"], None, ["h3", "h4"], "h3") == {"h1": "h3", "h2": "h4"}


def test_map_options():
    assert nodes.map_options({"h1": "h1", "h2": "h3"}) == ["--map", "h2=h3"]


def test_no_nodes():
    with pytest.raises(ValueError):
        nodes.place(["h1"], "h1", [], "")


# ---- what dmtcp-slurm run does -------------------------------------------------

def test_start_kind():
    assert job.start_kind(False) == "launch"
    assert job.start_kind(True) == "restart"


def test_requeue_signal_checkpoints_stops_and_requeues():
    m = job.JobMachine(requeues=0, max_requeues=5)
    acts = m.requeue_signal("SIGUSR1")
    assert acts[-1] == job.Checkpoint(stop=True)
    assert m.requeue_signal("SIGTERM") == []  # Slurm's SIGTERM after our requeue
    assert m.program_exited(137) == []        # stopped by our own -kc
    assert m.checkpointed(True) == [job.Requeue()]
    acts = m.requeued(True)
    assert acts[-1] == job.Exit(job.REQUEUED) and "requeue 1" in acts[0].text
    assert m.requeue_signal("SIGTERM") == []


def test_a_failed_checkpoint_does_not_requeue_and_is_tried_again():
    m = job.JobMachine(requeues=0, max_requeues=5)
    m.requeue_signal("SIGUSR1")
    acts = m.checkpointed(False, "no trees")
    assert all(not isinstance(a, job.Requeue) for a in acts)
    assert "no trees" in acts[0].text and acts[-1] == job.RetryLater("SIGUSR1")
    assert "(try 2)" in m.requeue_signal("SIGUSR1")[0].text
    assert m.checkpointed(True) == [job.Requeue()]


def test_tries_are_limited():
    m = job.JobMachine(requeues=0, max_requeues=5)
    for _ in range(job.MAX_TRIES):
        m.requeue_signal("SIGUSR1")
        acts = m.checkpointed(False)
    assert not any(isinstance(a, job.RetryLater) for a in acts)
    assert m.program_exited(3)[-1] == job.Exit(3)


def test_checkpoint_signal_goes_on():
    m = job.JobMachine(requeues=1, max_requeues=5)
    assert m.checkpoint_signal("SIGUSR2")[-1] == job.Checkpoint(stop=False)
    assert m.checkpoint_signal("SIGUSR2") == []  # one at a time
    assert m.checkpointed(True) == []
    acts = m.program_exited(0)
    assert acts[-1] == job.Exit(0) and "after 1 requeue" in acts[0].text


def test_requeue_limit_only_checkpoints():
    m = job.JobMachine(requeues=2, max_requeues=2)
    acts = m.requeue_signal("SIGUSR1")
    assert acts[-1] == job.Checkpoint(stop=False)
    assert m.checkpointed(True) == []
    assert m.program_exited(0)[-1] == job.Exit(0)


def test_failed_requeue_is_said():
    m = job.JobMachine(requeues=0, max_requeues=5)
    m.requeue_signal("SIGUSR1")
    m.checkpointed(True)
    acts = m.requeued(False, "Requeue disabled")
    assert "Requeue disabled" in acts[0].text and acts[-1] == job.Exit(job.REQUEUE_FAILED)
    assert m.program_exited(137) == []
