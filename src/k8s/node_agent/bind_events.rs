//! What the bind guard saw, said where people look: an Event on the pod that bound a port it
//! does not hold, naming the port, its pool and its holder on the node.

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use crate::api::GuardMode;
use crate::ledger::node_guard::port_of_slot;

/// How a bind was judged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BindVerdict {
    /// Refused with EPERM (`Enforce`).
    Refused,
    /// Allowed, with an Event (`Audit`).
    Audited,
    /// Allowed to a pod the agent had not seen yet, which turned out not to hold the port.
    TakenBeforeSeen,
}

impl BindVerdict {
    pub fn label(self) -> &'static str {
        match self {
            Self::Refused => "refused",
            Self::Audited => "audited",
            Self::TakenBeforeSeen => "taken_before_seen",
        }
    }
}

/// One bind, as the Event on its pod tells it.
pub struct BindEvent<'a> {
    pub verdict: BindVerdict,
    pub slot: u32,
    pub count: u64,
    pub pool: &'a str,
    pub mode: GuardMode,
    pub node: &'a str,
    /// The port's holder on the node (`namespace/name` of the pod and of its PortAllocation).
    pub holder: Option<(String, String)>,
}

impl BindEvent<'_> {
    pub fn reason(&self) -> &'static str {
        match self.verdict {
            BindVerdict::Refused => "PortBindRefused",
            BindVerdict::Audited => "PortBindAudited",
            BindVerdict::TakenBeforeSeen => "PortTakenBeforeGuarded",
        }
    }

    pub fn message(&self) -> String {
        let (protocol, port) = port_of_slot(self.slot);
        let holder = match &self.holder {
            Some((pod, owner)) => format!(
                "held on node {} by pod {pod} (PortAllocation {owner})",
                self.node
            ),
            None => format!("held by no pod on node {}", self.node),
        };
        let times = if self.count > 1 {
            format!(" ({} times)", self.count)
        } else {
            String::new()
        };
        let what = match self.verdict {
            BindVerdict::Refused => "was refused with EPERM".to_string(),
            BindVerdict::Audited => "was allowed, and would be refused under Enforce".to_string(),
            BindVerdict::TakenBeforeSeen => {
                "was allowed before the node agent saw this pod; the pod does not hold it"
                    .to_string()
            }
        };
        format!(
            "bind of port {port}/{protocol}{times} {what}: the port is in PortPool {} (guard {}), {holder}. \
             Use the ports the pod webhook gives the pod (its env), or allocate this port to its \
             PortAllocation.",
            self.pool, self.mode
        )
    }
}

/// Publishes the agent's Events about binds.
#[derive(Clone)]
pub struct BindEvents {
    recorder: Recorder,
}

impl BindEvents {
    pub fn new(client: kube::Client, node: &str) -> Self {
        let reporter = Reporter {
            controller: "portalloc-node-agent".into(),
            instance: Some(node.to_string()),
        };
        Self {
            recorder: Recorder::new(client, reporter),
        }
    }

    pub async fn publish(&self, pod: &Pod, bind: &BindEvent<'_>) {
        let event = Event {
            type_: EventType::Warning,
            reason: bind.reason().into(),
            note: Some(bind.message()),
            action: "Bind".into(),
            secondary: None,
        };
        let reference: ObjectReference = pod.object_ref(&());
        if let Err(e) = self.recorder.publish(&event, &reference).await {
            tracing::warn!(error = %crate::k8s::error_chain(&e), "could not record an Event on pod {:?}", reference.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Protocol;
    use crate::ledger::node_guard::slot;

    #[test]
    fn a_refusal_names_the_port_the_pool_and_the_holder() {
        let bind = BindEvent {
            verdict: BindVerdict::Refused,
            slot: slot(Protocol::Tcp, 30001),
            count: 1,
            pool: "llm",
            mode: GuardMode::Enforce,
            node: "gpu-1",
            holder: Some(("team-a/decode-0".into(), "team-a/sglang".into())),
        };
        assert_eq!(
            bind.message(),
            "bind of port 30001/TCP was refused with EPERM: the port is in PortPool llm (guard \
             Enforce), held on node gpu-1 by pod team-a/decode-0 (PortAllocation team-a/sglang). \
             Use the ports the pod webhook gives the pod (its env), or allocate this port to its \
             PortAllocation."
        );
    }
}
