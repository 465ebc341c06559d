//! Builders for specs in unit tests, so each test states only what it is about.

use super::{PortReference, PortRequest, PortScope, Role};

pub fn port(name: &str, scope: PortScope, env: &str) -> PortRequest {
    PortRequest {
        name: name.into(),
        scope,
        env: env.into(),
        port: None,
        ..Default::default()
    }
}

pub fn role(name: &str, replicas: i32, ports: Vec<PortRequest>) -> Role {
    Role {
        name: name.into(),
        replicas,
        ports,
        references: vec![],
        ..Default::default()
    }
}

pub fn reference(env: &str, from: &str) -> PortReference {
    PortReference {
        env: env.into(),
        from: from.into(),
        ..Default::default()
    }
}

/// router (1 pod, RoleScoped http), prefill (`prefill` pods, PodScoped bootstrap),
/// decode (`decode` pods, PodScoped http): the shape of a prefill/decode group.
pub fn pd_roles(prefill: i32, decode: i32) -> Vec<Role> {
    vec![
        role(
            "router",
            1,
            vec![port("http", PortScope::RoleScoped, "ROUTER_PORT")],
        ),
        role(
            "prefill",
            prefill,
            vec![port("bootstrap", PortScope::PodScoped, "BOOTSTRAP_PORT")],
        ),
        role(
            "decode",
            decode,
            vec![port("http", PortScope::PodScoped, "DECODE_PORT")],
        ),
    ]
}
