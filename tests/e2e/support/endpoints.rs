//! Local processes behind a Service, for kube-apiserver to call as it calls pods: started with
//! `--enable-aggregator-routing`, it sends a webhook Service's calls to a ready endpoint of the
//! Service's EndpointSlices, picked each time it dials. EndpointSlices refuse loopback
//! addresses, so the processes listen on a non-loopback address of this machine
//! ([`routable_address`]).
//!
//! With no kubelet and no EndpointSlice controller in the test control plane, [`Endpoints`]
//! plays both: it probes each member's `/readyz` every [`PROBE_PERIOD`] (a readiness probe with
//! failureThreshold 1) and writes one EndpointSlice per member with that readiness (one per
//! member, since a slice's ports are shared by its endpoints and every member listens on a port
//! of its own).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How often the stand-in kubelet probes `/readyz`.
pub const PROBE_PERIOD: Duration = Duration::from_millis(1000);

/// An IPv4 address of this machine that EndpointSlices accept (not loopback, not link-local).
pub fn routable_address() -> Option<Ipv4Addr> {
    let mut found = None;
    // SAFETY: getifaddrs fills a list we only read, then free with freeifaddrs.
    unsafe {
        let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
        if libc::getifaddrs(&mut list) != 0 {
            return None;
        }
        let mut entry = list;
        while !entry.is_null() {
            let addr = (*entry).ifa_addr;
            if !addr.is_null() && i32::from((*addr).sa_family) == libc::AF_INET {
                let v4 = &*(addr as *const libc::sockaddr_in);
                let ip = Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr));
                if !ip.is_loopback() && !ip.is_link_local() && !ip.is_unspecified() {
                    found.get_or_insert(ip);
                }
            }
            entry = (*entry).ifa_next;
        }
        libc::freeifaddrs(list);
    }
    found
}

/// The stand-in kubelet and EndpointSlice controller of one Service.
#[derive(Clone)]
pub struct Endpoints {
    client: Client,
    ip: Ipv4Addr,
    namespace: String,
    service: String,
    /// The Service port's name, which the slices' port must carry.
    port_name: String,
    members: Arc<Mutex<BTreeMap<String, Member>>>,
}

/// A member: (serving port on the routable address, probe port on loopback, ready as last
/// written).
type Member = (u16, u16, Option<bool>);

impl Endpoints {
    /// Start probing (until the test's runtime ends).
    pub fn new(
        client: Client,
        ip: Ipv4Addr,
        namespace: &str,
        service: &str,
        port_name: &str,
    ) -> Endpoints {
        let endpoints = Endpoints {
            client,
            ip,
            namespace: namespace.to_string(),
            service: service.to_string(),
            port_name: port_name.to_string(),
            members: Arc::default(),
        };
        let runner = endpoints.clone();
        tokio::spawn(async move {
            loop {
                runner.sync().await;
                tokio::time::sleep(PROBE_PERIOD).await;
            }
        });
        endpoints
    }

    /// A pod of the Service: its slice appears, not ready until its probe passes.
    pub fn add(&self, name: &str, port: u16, probe_port: u16) {
        self.members
            .lock()
            .unwrap()
            .insert(name.to_string(), (port, probe_port, None));
    }

    /// Its pod is gone: its slice goes.
    pub async fn remove(&self, name: &str) {
        self.members.lock().unwrap().remove(name);
        let _ = self
            .slices()
            .delete(&self.slice_name(name), &DeleteParams::default())
            .await;
    }

    /// Until `name` is ready in its slice.
    pub async fn wait_ready(&self, name: &str) {
        let started = Instant::now();
        while self.members.lock().unwrap().get(name).map(|m| m.2) != Some(Some(true)) {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "{name} never became ready in the endpoints"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn slices(&self) -> Api<EndpointSlice> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn slice_name(&self, member: &str) -> String {
        format!("{}-{member}", self.service)
    }

    async fn sync(&self) {
        let members: Vec<_> = self
            .members
            .lock()
            .unwrap()
            .iter()
            .map(|(name, m)| (name.clone(), *m))
            .collect();
        for (name, (port, probes, written)) in members {
            let ready = http_status(probes, "/readyz").await == Some(200);
            if written == Some(ready) || !self.members.lock().unwrap().contains_key(&name) {
                continue;
            }
            let slice = serde_json::json!({
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": self.slice_name(&name),
                    "namespace": self.namespace,
                    "labels": {
                        "kubernetes.io/service-name": self.service,
                        "endpointslice.kubernetes.io/managed-by": "portalloc-e2e",
                    },
                },
                "addressType": "IPv4",
                "ports": [{"name": self.port_name, "port": port, "protocol": "TCP"}],
                "endpoints": [{"addresses": [self.ip.to_string()], "conditions": {"ready": ready}}],
            });
            let applied = self
                .slices()
                .patch(
                    &self.slice_name(&name),
                    &PatchParams::apply("portalloc-e2e").force(),
                    &Patch::Apply(&slice),
                )
                .await;
            if let (Ok(_), Some(member)) = (applied, self.members.lock().unwrap().get_mut(&name)) {
                member.2 = Some(ready);
            }
        }
    }
}

/// The answer's status code to `GET path` on loopback `port`, if any.
async fn http_status(port: u16, path: &str) -> Option<u16> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(1), stream.read_to_string(&mut answer))
        .await
        .ok()?
        .ok()?;
    answer.split_whitespace().nth(1)?.parse().ok()
}
