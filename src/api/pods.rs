//! Pod names and addresses from a role's workload, and back from a pod name to its role and
//! index. Pure: the spec (and the namespace, for addresses) in, names out.
//!
//! A pod is known by its flat index `g * replicas + i` (pod i of group g), the index its
//! PodScoped ports are held under.

use super::{LwsMember, PortAllocationSpec, Role, WorkloadKind};

/// One pod of a role, as references and env files see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pod {
    /// The pod's name (for a Deployment, which names pods at random: the role's name, which is
    /// also its env file's).
    pub name: String,
    pub group: u32,
    /// Index within its group.
    pub index: u32,
    /// `group * replicas + index`.
    pub flat: u32,
}

impl PortAllocationSpec {
    /// `spec.groups`, default 1.
    pub fn group_count(&self) -> u32 {
        self.groups.unwrap_or(1).max(1) as u32
    }
}

impl Role {
    /// Pods per group.
    pub fn per_group(&self) -> u32 {
        self.replicas.max(0) as u32
    }

    fn is_deployment(&self) -> bool {
        self.workload
            .as_ref()
            .is_some_and(|w| w.kind == WorkloadKind::Deployment)
    }

    /// Pod `flat` of this role.
    pub fn pod(&self, flat: u32) -> Pod {
        let per_group = self.per_group().max(1);
        let (group, index) = (flat / per_group, flat % per_group);
        let name = match &self.workload {
            None => format!("{}-{flat}", self.name),
            Some(w) => match (w.kind, w.member) {
                (WorkloadKind::StatefulSet, _) => format!("{}-{flat}", w.name),
                (WorkloadKind::LeaderWorkerSet, Some(LwsMember::Workers)) => {
                    format!("{}-{group}-{}", w.name, index + 1)
                }
                // A leader is worker 0 of its group, named after the group alone.
                (WorkloadKind::LeaderWorkerSet, _) => format!("{}-{group}", w.name),
                (WorkloadKind::Deployment, _) => self.name.clone(),
            },
        };
        Pod {
            name,
            group,
            index,
            flat,
        }
    }

    /// Every pod of the role, in flat order, across `groups` groups.
    pub fn pods(&self, groups: u32) -> impl Iterator<Item = Pod> + '_ {
        (0..groups * self.per_group()).map(|flat| self.pod(flat))
    }

    /// The pods that get an env file of their own: every pod, except that a Deployment's
    /// pods (random names) share one file named after the role.
    pub fn env_file_pods(&self, groups: u32) -> Vec<Pod> {
        if self.is_deployment() {
            self.pods(groups).take(1).collect()
        } else {
            self.pods(groups).collect()
        }
    }

    /// The Service that gives this role's pods DNS names, if any.
    fn service(&self) -> Option<&str> {
        let w = self.workload.as_ref()?;
        match (w.kind, &w.service) {
            (_, Some(service)) => Some(service),
            // LWS creates a headless Service named after itself (its Shared subdomain policy).
            (WorkloadKind::LeaderWorkerSet, None) => Some(&w.name),
            _ => None,
        }
    }

    /// Whether `{address}` means something for this role's pods.
    pub fn has_address(&self) -> bool {
        self.service().is_some()
    }

    /// Why this role's pods have no address, for an error message.
    pub fn no_address_reason(&self) -> String {
        match &self.workload {
            None => format!(
                "role {} has no workload, so its pods have no address",
                self.name
            ),
            Some(w) => format!(
                "role {}'s {:?} {} names no service, so its pods have no address",
                self.name, w.kind, w.name
            ),
        }
    }

    /// The DNS name of `pod` in `namespace`: `<pod>.<service>.<ns>.svc`, or for a Deployment
    /// `<service>.<ns>.svc`.
    pub fn address(&self, pod: &Pod, namespace: &str) -> Option<String> {
        let service = self.service()?;
        Some(if self.is_deployment() {
            format!("{service}.{namespace}.svc")
        } else {
            format!("{}.{service}.{namespace}.svc", pod.name)
        })
    }

    /// The flat index of the pod named `name`, if this role has such a pod.
    pub fn flat_of(&self, name: &str, groups: u32) -> Option<u32> {
        let count = groups * self.per_group();
        let number = |text: &str| -> Option<u32> {
            (!text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()))
                .then(|| text.parse().ok())
                .flatten()
        };
        let flat = match &self.workload {
            None => number(name.strip_prefix(&self.name)?.strip_prefix('-')?)?,
            // A Deployment's pods share the file named after the role.
            Some(w) if w.kind == WorkloadKind::Deployment => {
                return (name == self.name && count > 0).then_some(0);
            }
            Some(w) => {
                let tail = name.strip_prefix(&w.name)?;
                match (w.kind, w.member) {
                    (WorkloadKind::StatefulSet, _) | (WorkloadKind::Deployment, _) => {
                        number(tail.strip_prefix('-')?)?
                    }
                    (WorkloadKind::LeaderWorkerSet, Some(LwsMember::Workers)) => {
                        let (group, worker) = tail.strip_prefix('-')?.split_once('-')?;
                        let (group, worker) = (number(group)?, number(worker)?);
                        if worker == 0 || worker > self.per_group() {
                            return None;
                        }
                        group * self.per_group() + worker - 1
                    }
                    (WorkloadKind::LeaderWorkerSet, _) => {
                        number(tail.strip_prefix('-')?)? * self.per_group()
                    }
                }
            }
        };
        (flat < count).then_some(flat)
    }
}

/// Every (role index, flat index) with a pod (or a Deployment role's file) named `name`.
pub fn find_pod(spec: &PortAllocationSpec, name: &str) -> Vec<(usize, u32)> {
    let groups = spec.group_count();
    spec.roles
        .iter()
        .enumerate()
        .filter_map(|(r, role)| role.flat_of(name, groups).map(|flat| (r, flat)))
        .collect()
}

/// Above this many env files in all, [`colliding_pod`] does not look (it would build every
/// name); `resolve_all` still refuses a collision when it meets one.
const COLLISION_CHECK_LIMIT: u32 = 1 << 18;

/// The first env file name two roles would both write (later role index, name, earlier role
/// index): the ConfigMap holds one file per name, so one role's pods would read the other's.
pub(crate) fn colliding_pod(spec: &PortAllocationSpec) -> Option<(usize, String, usize)> {
    let groups = spec.group_count();
    let total: u32 = spec
        .roles
        .iter()
        .map(|r| groups.saturating_mul(r.per_group()))
        .fold(0, u32::saturating_add);
    if total > COLLISION_CHECK_LIMIT {
        return None;
    }
    let mut seen = std::collections::HashMap::new();
    for (r, role) in spec.roles.iter().enumerate() {
        for pod in role.env_file_pods(groups) {
            if let Some(&first) = seen.get(&pod.name) {
                return Some((r, pod.name, first));
            }
            seen.insert(pod.name, r);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::super::Workload;
    use super::super::fixtures::role;
    use super::*;

    fn with(name: &str, replicas: i32, kind: WorkloadKind, workload: &str) -> Role {
        let member = match (kind, name) {
            (WorkloadKind::LeaderWorkerSet, "leader") => Some(LwsMember::Leader),
            (WorkloadKind::LeaderWorkerSet, _) => Some(LwsMember::Workers),
            _ => None,
        };
        Role {
            workload: Some(Workload {
                kind,
                name: workload.into(),
                service: None,
                member,
            }),
            ..role(name, replicas, vec![])
        }
    }

    fn names(role: &Role, groups: u32) -> Vec<String> {
        role.pods(groups).map(|p| p.name).collect()
    }

    #[test]
    fn statefulset_pods_are_numbered_across_groups() {
        let mut prefill = with("prefill", 2, WorkloadKind::StatefulSet, "sglang-prefill");
        assert_eq!(
            names(&prefill, 2),
            vec![
                "sglang-prefill-0",
                "sglang-prefill-1",
                "sglang-prefill-2",
                "sglang-prefill-3"
            ]
        );
        let pod = prefill.pod(3);
        assert_eq!((pod.group, pod.index, pod.flat), (1, 1, 3));
        assert_eq!(prefill.address(&pod, "llm"), None);
        assert!(!prefill.has_address());
        prefill.workload.as_mut().unwrap().service = Some("prefill".into());
        assert_eq!(
            prefill.address(&pod, "llm").as_deref(),
            Some("sglang-prefill-3.prefill.llm.svc")
        );
        assert_eq!(prefill.flat_of("sglang-prefill-3", 2), Some(3));
        assert_eq!(prefill.flat_of("sglang-prefill-4", 2), None);
        assert_eq!(prefill.flat_of("sglang-prefill-x", 2), None);
        assert_eq!(prefill.flat_of("other-1", 2), None);
    }

    #[test]
    fn lws_leaders_and_workers_follow_group_and_worker_index() {
        // LWS replicas = 2 groups, size = 3: one leader and two workers per group.
        let leader = with("leader", 1, WorkloadKind::LeaderWorkerSet, "sglang");
        let workers = with("worker", 2, WorkloadKind::LeaderWorkerSet, "sglang");
        assert_eq!(names(&leader, 2), vec!["sglang-0", "sglang-1"]);
        assert_eq!(
            names(&workers, 2),
            vec!["sglang-0-1", "sglang-0-2", "sglang-1-1", "sglang-1-2"]
        );
        let w = workers.pod(3);
        assert_eq!((w.name.as_str(), w.group, w.index), ("sglang-1-2", 1, 1));
        // The Service LWS creates is named after it.
        assert_eq!(
            leader.address(&leader.pod(1), "ns").as_deref(),
            Some("sglang-1.sglang.ns.svc")
        );
        assert_eq!(
            workers.address(&w, "ns").as_deref(),
            Some("sglang-1-2.sglang.ns.svc")
        );
        assert_eq!(leader.flat_of("sglang-1", 2), Some(1));
        assert_eq!(leader.flat_of("sglang-2", 2), None);
        assert_eq!(leader.flat_of("sglang-1-1", 2), None);
        assert_eq!(workers.flat_of("sglang-1-2", 2), Some(3));
        assert_eq!(workers.flat_of("sglang-1-0", 2), None);
        assert_eq!(workers.flat_of("sglang-1-3", 2), None);
        assert_eq!(workers.flat_of("sglang-1", 2), None);
    }

    #[test]
    fn deployment_pods_share_one_file_and_the_service_address() {
        let mut router = with("router", 3, WorkloadKind::Deployment, "sglang-router");
        let files: Vec<String> = router
            .env_file_pods(1)
            .into_iter()
            .map(|p| p.name)
            .collect();
        assert_eq!(files, vec!["router"]);
        assert_eq!(router.flat_of("router", 1), Some(0));
        assert_eq!(router.flat_of("sglang-router-0", 1), None);
        router.workload.as_mut().unwrap().service = Some("router".into());
        assert_eq!(
            router.address(&router.pod(2), "llm").as_deref(),
            Some("router.llm.svc")
        );
    }

    #[test]
    fn roles_without_workload_are_named_after_the_role() {
        let plain = role("decode", 2, vec![]);
        assert_eq!(
            names(&plain, 2),
            vec!["decode-0", "decode-1", "decode-2", "decode-3"]
        );
        assert_eq!(plain.flat_of("decode-3", 2), Some(3));
        assert!(!plain.has_address());
        assert_eq!(
            plain.no_address_reason(),
            "role decode has no workload, so its pods have no address"
        );
        let spec = PortAllocationSpec {
            pool: "p".into(),
            groups: Some(2),
            roles: vec![
                plain,
                with("leader", 1, WorkloadKind::LeaderWorkerSet, "decode"),
            ],
            ..Default::default()
        };
        assert_eq!(find_pod(&spec, "decode-1"), vec![(0, 1), (1, 1)]);
        assert_eq!(find_pod(&spec, "decode-3"), vec![(0, 3)]);
        assert!(find_pod(&spec, "nobody-0").is_empty());
        // decode-0 is both role decode's pod 0 and the LWS leader of group 0.
        assert_eq!(colliding_pod(&spec), Some((1, "decode-0".into(), 0)));
        let mut apart = spec.clone();
        apart.roles[1].workload.as_mut().unwrap().name = "lws".into();
        assert_eq!(colliding_pod(&apart), None);
    }
}
