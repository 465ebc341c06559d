//! The node agent's kernel side against the real kernel: the bind guard attached to a cgroup v2
//! tree laid out as kubelet's, real processes binding real ports from inside it, and the
//! reserved-ports setting of a network namespace of its own. Needs root and a cgroup2 mount
//! (CI runs as root; `mount -t cgroup2` shows where the hierarchy is).

mod away;
#[path = "../common/mod.rs"]
mod common;
mod detach;
mod guard;
mod pins;
mod reserved;
