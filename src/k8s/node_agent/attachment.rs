//! The bind guard's attachment, seen from the agent's rounds: where kubelet's `kubepods` and
//! the guard's pins are, attaching (or taking over) the guard, checking it is still attached
//! whole, and finishing an in-place upgrade once the new maps are filled.

use std::path::PathBuf;

use super::Agent;
use crate::node::bind_guard::BindGuard;
use crate::node::cgroups::{self, CgroupDriver};
use crate::node::guard_pins;
use crate::node::netns_cookie;

impl Agent {
    pub(super) fn driver(&self) -> CgroupDriver {
        self.options
            .cgroup_driver
            .unwrap_or_else(|| CgroupDriver::detect(&self.options.cgroup_root))
    }

    pub(super) fn kubepods(&self) -> PathBuf {
        self.options.cgroup_root.join(self.driver().kubepods())
    }

    pub(super) fn pins(&self) -> PathBuf {
        guard_pins::pin_dir(&self.options.bpf_dir, &self.kubepods())
    }

    /// An upgrade whose maps are new swaps its program in once this round filled them; if
    /// that fails, the guard is read again from its pins next round.
    pub(super) fn finish_upgrade(&mut self) {
        let Some(guard) = self.guard.as_mut() else {
            return;
        };
        match guard.finish_upgrade() {
            Ok(false) => {}
            Ok(true) => tracing::info!(
                node = %self.options.node_name,
                version = %crate::node::bind_guard::program_version(),
                "bind guard upgraded in place: its links run this release's program, over new maps filled first"
            ),
            Err(e) => {
                tracing::warn!(node = %self.options.node_name, "{e}");
                self.guard = None;
            }
        }
    }

    /// Whether the guard's programs are still attached, both of them: one detached (by
    /// `node-agent --detach`, bpftool, a cgroup recreated) is attached again this round, from
    /// nothing, so no bind is judged by half a guard or by maps nobody keeps.
    pub(super) fn check_attachment(&mut self) {
        let kubepods = self.kubepods();
        let attached = BindGuard::attached(&kubepods, &self.pins());
        if matches!(attached, Ok(2)) {
            return;
        }
        let found = match attached {
            Ok(n) => format!("{n} of its 2 links"),
            Err(e) => format!("its programs could not be listed: {e}"),
        };
        tracing::warn!(
            node = %self.options.node_name,
            kubepods = %kubepods.display(),
            "the bind guard is no longer attached whole ({found}); attaching it again"
        );
        if let Err(e) = BindGuard::detach(&kubepods, &self.pins()) {
            tracing::warn!(node = %self.options.node_name, "detaching what is left of the guard: {e}");
        }
        self.guard = None;
    }

    pub(super) fn attach_guard(&mut self) {
        let root = &self.options.cgroup_root;
        let kubepods = self.kubepods();
        let pins = self.pins();
        let attached = if !cgroups::is_cgroup2(root) {
            Err(format!(
                "no cgroup v2 hierarchy at {} (--cgroup-root)",
                root.display()
            ))
        } else {
            cgroups::level(&kubepods)
                .map_err(|e| format!("{}: {e}", kubepods.display()))
                .and_then(|level| {
                    let cookie = netns_cookie().map_err(|e| format!("SO_NETNS_COOKIE: {e}"))?;
                    BindGuard::attach(&kubepods, &pins, level + 1, cookie)
                        .map_err(|e| e.to_string())
                })
        };
        match attached {
            Ok(guard) => {
                tracing::info!(
                    node = %self.options.node_name,
                    kubepods = %kubepods.display(),
                    pins = %pins.display(),
                    took_over = guard.took_over,
                    upgrading = guard.upgrading(),
                    version = %crate::node::bind_guard::program_version(),
                    "bind guard attached"
                );
                self.guard = Some(guard);
                self.guard_failure = None;
                self.written_pods = None;
                self.written_owners = None;
                self.written_modes = None;
            }
            Err(why) => {
                if self.guard_failure.as_ref() != Some(&why) {
                    tracing::warn!(
                        node = %self.options.node_name,
                        "binds are not guarded on this node: {why}; pool ports are still reserved"
                    );
                }
                self.guard_failure = Some(why);
            }
        }
    }
}
