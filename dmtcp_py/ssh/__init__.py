"""Remote processes under control: `ssh HOST CMD` from inside a tree.

As in DMTCP (dmtcp_ssh / dmtcp_sshd): the shim runs `dmtcp-ssh` instead
of ssh; it uses the real ssh only to start, detached, `dmtcp-launch --join
... relay CMD` on the other host, and then carries CMD's stdin, stdout,
stderr and exit status over a TCP connection of its own with the relay.
Both ends are processes of controlled trees, so that connection is
drained, checkpointed and made again at restart like any other, wherever
the two trees restart; the real ssh session is over before any checkpoint.
"""
