//! Tests of pod_ports.rs: the ports a pod would get, against the shards' entries.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use super::*;
use crate::api::{PortAllocationStatus, PortAssignment, PortRequest, PortScope};
use crate::ledger::fixtures::{allocation, holder, pool_of, pool_reused, shard_in};
use crate::ledger::{recorded_holdings, split_by_shard};

/// PortAllocation `a` (uid `a`, ns/a) in pool `p`: role `web` of 2 pods, each with a PodScoped
/// `http` port and a block of 4 `nixl` ports, recorded in `shards` (`copy * 256 + window`).
fn pa(http: [i32; 2], nixl: [i32; 2], shards: Vec<i32>) -> PortAllocation {
    let mut pa = allocation("a", 2, None);
    pa.spec.roles[0].ports.push(PortRequest {
        name: "nixl".into(),
        env: "NIXL_PORT".into(),
        count: Some(4),
        ..Default::default()
    });
    let assignment = |port: &str, env: &str, values: [i32; 2], count| PortAssignment {
        role: "web".into(),
        port: port.into(),
        scope: PortScope::PodScoped,
        env: env.into(),
        values: values.to_vec(),
        count,
        group_size: None,
        copies: Vec::new(),
    };
    pa.status = Some(PortAllocationStatus {
        assignments: vec![
            assignment("http", "HTTP_PORT", http, None),
            assignment("nixl", "NIXL_PORT", nixl, Some(4)),
        ],
        shards,
        ..Default::default()
    });
    pa
}

fn pod(name: &str) -> Pod {
    let mut pod = Pod::default();
    pod.metadata.name = Some(name.into());
    pod
}

/// The ports pod `web-<index>` of `pa` would get, as the webhook computes them.
fn ports_of(pa: &PortAllocation, index: u32) -> (PodInjection, Vec<PodPortInShard>) {
    let injection = pa.pod_injection(&pod(&format!("web-{index}"))).unwrap();
    let ports = pod_ports(pa, &injection).unwrap();
    (injection, ports)
}

fn read(shards: Vec<(ShardKey, PortPoolShard)>) -> BTreeMap<ShardKey, Option<PortPoolShard>> {
    shards.into_iter().map(|(k, s)| (k, Some(s))).collect()
}

#[test]
fn every_port_of_the_pod_and_of_its_blocks_with_the_shard_of_its_window() {
    // Window 117 is 29952-30207: 30200 is in it, the block 30206-30209 crosses into 118.
    let pa = pa([30200, 30300], [30206, 30500], vec![117, 118, 119]);
    let (_, ports) = ports_of(&pa, 0);
    let listed: Vec<(&str, u16, u16)> = ports
        .iter()
        .map(|p| (p.name.as_str(), p.port, p.shard.window))
        .collect();
    assert_eq!(
        listed,
        [
            ("web.http", 30200, 117),
            ("web.nixl", 30206, 117),
            ("web.nixl", 30207, 117),
            ("web.nixl", 30208, 118),
            ("web.nixl", 30209, 118),
        ]
    );
    assert!(ports.iter().all(|p| p.shard.copy == 0));
    assert_eq!(
        pod_port_shards(&ports),
        [ShardKey::first(117), ShardKey::first(118)].into()
    );
    // Pod 1's ports lie in windows 118 (30300) and 119 (30500-30503): only those are read.
    let (_, ports) = ports_of(&pa, 1);
    assert_eq!(
        pod_port_shards(&ports),
        [ShardKey::first(118), ShardKey::first(119)].into()
    );
}

#[test]
fn the_shards_of_the_copy_the_status_names() {
    let pa = pa([30200, 30201], [30202, 30100], vec![2 * 256 + 117]);
    let (_, ports) = ports_of(&pa, 1);
    assert_eq!(ports.len(), 5);
    assert!(
        ports.iter().all(|p| p.shard == ShardKey::new(2, 117)),
        "{ports:?}"
    );
}

#[test]
fn each_pod_of_a_workload_spread_over_copies_is_checked_in_its_own_copy() {
    // Pod 0 in copy 0, pod 1 in copy 1, both with port 30200 (kept apart by the scheduler).
    let mut pa = pa([30200, 30200], [30204, 30204], vec![117, 256 + 117]);
    for assignment in &mut pa.status.as_mut().unwrap().assignments {
        assignment.copies = vec![0, 1];
    }
    for (index, copy) in [(0, 0), (1, 1)] {
        let (_, ports) = ports_of(&pa, index);
        assert_eq!(ports.len(), 5);
        assert!(
            ports.iter().all(|p| p.shard == ShardKey::new(copy, 117)),
            "pod {index}: {ports:?}"
        );
    }
    // And the record agrees: each copy's entry of `a` holds that pod's ports alone.
    let pool = pool_reused(&["29952-30207"], 2);
    let own = holder("a", "web.http=30200 web.nixl=30204-30207");
    let shards = read(vec![
        (
            ShardKey::new(0, 117),
            shard_in(&pool, ShardKey::new(0, 117), vec![own.clone()]),
        ),
        (
            ShardKey::new(1, 117),
            shard_in(&pool, ShardKey::new(1, 117), vec![own]),
        ),
    ]);
    for index in [0, 1] {
        let (_, ports) = ports_of(&pa, index);
        assert_eq!(unheld_ports(&pa, &ports, &shards), vec![], "pod {index}");
    }
}

#[test]
fn ports_the_owner_holds_pass_and_another_owners_port_is_named_with_its_owner() {
    let pool = pool_of(&["30000-30999"], &[]);
    let honest = pa([30200, 30201], [30202, 30206], vec![117, 118]);
    // The record as the allocator writes it: pod 1's block 30206-30209 in two pieces, one in
    // each window; b holds 30190 beside a in window 117.
    let mut shards = BTreeMap::new();
    for (window, part) in split_by_shard(&recorded_holdings(honest.status.as_ref().unwrap())) {
        let key = ShardKey::first(window);
        let mut entries = vec![holder("a", &part.encode())];
        if window == 117 {
            entries.push(holder("b", "db.sql=30190"));
        }
        shards.insert(key, Some(shard_in(&pool, key, entries)));
    }
    assert_eq!(shards.len(), 2);
    for index in [0, 1] {
        let (_, ports) = ports_of(&honest, index);
        assert_eq!(unheld_ports(&honest, &ports, &shards), [], "pod {index}");
    }
    let k = ShardKey::first(117);

    // Tenant a writes b's port into its own status; the record still gives a 30200.
    let forged = pa([30190, 30201], [30202, 30206], vec![117, 118]);
    let (injection, ports) = ports_of(&forged, 0);
    let mismatches = unheld_ports(&forged, &ports, &shards);
    assert_eq!(
        mismatches,
        [Mismatch {
            port: PodPortInShard {
                name: "web.http".into(),
                port: 30190,
                shard: k,
            },
            holder: PortHolder::Other("ns/b".into()),
        }]
    );
    let denial = RecordDenial::new(&forged, &injection, mismatches).to_string();
    assert_eq!(
        denial,
        "the status of PortAllocation ns/a gives pod web[0] port 30190 (web.http), but pool p's \
         record (PortPoolShard p-117) gives that port to PortAllocation ns/b: the status does not \
         match the record (written by hand, or stale). Run kubectl portalloc sync a -n ns, which \
         rewrites the status from the record (kubectl portalloc repair --pool p if the record is \
         what is wrong); the workload controller retries the pod"
    );
    // Pod 1 of the same forged status gets only its own ports.
    let (_, ports) = ports_of(&forged, 1);
    assert_eq!(unheld_ports(&forged, &ports, &shards), []);
}

#[test]
fn a_port_nobody_holds_a_missing_shard_and_a_stranger_are_denied() {
    let pool = pool_of(&["30000-30999"], &[]);
    let k = ShardKey::first(117);
    // A status ahead of the record: 30201 and the block's last two ports are nobody's.
    let ahead = pa([30201, 30300], [30202, 30400], vec![117, 118]);
    let (injection, ports) = ports_of(&ahead, 0);
    let mut shards = read(vec![(
        k,
        shard_in(&pool, k, vec![holder("a", "web.nixl=30202-30203")]),
    )]);
    shards.insert(ShardKey::first(118), None);
    let mismatches = unheld_ports(&ahead, &ports, &shards);
    let nobody: Vec<(u16, PortHolder)> = mismatches
        .iter()
        .map(|m| (m.port.port, m.holder.clone()))
        .collect();
    use PortHolder::Nobody;
    assert_eq!(nobody, [(30201, Nobody), (30204, Nobody), (30205, Nobody)]);
    let denial = RecordDenial::new(&ahead, &injection, mismatches).to_string();
    assert!(
        denial.contains("port 30201 (web.http), but pool p's record (PortPoolShard p-117) gives that port to no PortAllocation (and 30204 to nobody, 30205 to nobody)"),
        "{denial}"
    );

    // Another UID of the same name (the object was recreated) holds nothing of the new one's.
    let mut recreated = ahead.clone();
    recreated.metadata.uid = Some("a2".into());
    let (_, ports) = ports_of(&recreated, 0);
    let mismatches = unheld_ports(&recreated, &ports, &shards);
    assert_eq!(mismatches.len(), ports.len());
    assert_eq!(
        mismatches[1].holder,
        PortHolder::Other("ns/a (UID a, an earlier object)".into()),
        "{mismatches:?}"
    );

    // A port outside the pool (sshd's): its window has no shard.
    let outside = pa([22, 30300], [30202, 30400], vec![117]);
    let (_, ports) = ports_of(&outside, 0);
    let none: BTreeMap<_, _> = pod_port_shards(&ports)
        .into_iter()
        .map(|key| (key, None))
        .collect();
    let mismatches = unheld_ports(&outside, &ports, &none);
    assert_eq!(mismatches[0].port.port, 22);
    assert_eq!(mismatches[0].port.shard, ShardKey::first(0));
    assert_eq!(mismatches.len(), ports.len());
}

#[test]
fn only_the_named_copy_and_only_this_pools_shards_count() {
    let pool = pool_reused(&["30000-30999"], 2);
    // a holds 30200 in copy 1; b holds it in copy 0.
    let copy0 = ShardKey::first(117);
    let copy1 = ShardKey::new(1, 117);
    let record = vec![
        (
            copy0,
            shard_in(
                &pool,
                copy0,
                vec![holder("b", "x.y=30200,30201,30202-30209")],
            ),
        ),
        (
            copy1,
            shard_in(
                &pool,
                copy1,
                vec![holder(
                    "a",
                    "web.http=30200,30201 web.nixl=30202-30205,30206-30209",
                )],
            ),
        ),
    ];
    let shards = read(record);
    let in_copy1 = pa([30200, 30201], [30202, 30206], vec![256 + 117]);
    let (_, ports) = ports_of(&in_copy1, 0);
    assert_eq!(unheld_ports(&in_copy1, &ports, &shards), []);
    // The same ports claimed in copy 0 are b's there.
    let in_copy0 = pa([30200, 30201], [30202, 30206], vec![117]);
    let (_, ports) = ports_of(&in_copy0, 0);
    let mismatches = unheld_ports(&in_copy0, &ports, &shards);
    assert_eq!(mismatches.len(), 5);
    assert!(
        mismatches
            .iter()
            .all(|m| m.holder == PortHolder::Other("ns/b".into()))
    );

    // A shard object of another pool under the name (a hash collision of long names) holds
    // nothing for this one.
    let mut foreign = shards.clone();
    if let Some(Some(shard)) = foreign.get_mut(&copy1) {
        shard.spec.pool = "other".into();
    }
    let (_, ports) = ports_of(&in_copy1, 0);
    let mismatches = unheld_ports(&in_copy1, &ports, &foreign);
    assert_eq!(mismatches.len(), 5);
    assert!(mismatches.iter().all(|m| m.holder == PortHolder::Nobody));
}

#[test]
fn a_port_another_entry_holds_too_is_denied_to_both_owners() {
    // The tenancy policy lets a tenant rewrite its own entries: a adds b's 30190 to its own.
    let pool = pool_of(&["30000-30999"], &[]);
    let k = ShardKey::first(117);
    let shards = read(vec![(
        k,
        shard_in(
            &pool,
            k,
            vec![
                holder("a", "web.http=30190,30201 web.nixl=30202-30205"),
                holder("b", "db.sql=30190"),
            ],
        ),
    )]);
    let forged = pa([30190, 30201], [30202, 30100], vec![117]);
    let (injection, ports) = ports_of(&forged, 0);
    let mismatches = unheld_ports(&forged, &ports, &shards);
    assert_eq!(
        mismatches
            .iter()
            .map(|m| (m.port.port, m.holder.clone()))
            .collect::<Vec<_>>(),
        [(30190, PortHolder::Twice("ns/b".into()))]
    );
    let denial = RecordDenial::new(&forged, &injection, mismatches).to_string();
    assert!(
        denial.contains("gives that port to PortAllocation ns/b as well: a port held twice")
            && denial.contains("One of ns/a and ns/b must give it up"),
        "{denial}"
    );
    // b's own pod is refused that port too, naming a: no two pods are handed one port.
    let mut b = allocation("b", 1, None);
    b.spec.roles[0].name = "db".into();
    b.spec.roles[0].ports[0].name = "sql".into();
    b.status = Some(PortAllocationStatus {
        assignments: vec![PortAssignment {
            role: "db".into(),
            port: "sql".into(),
            scope: PortScope::PodScoped,
            env: "HTTP_PORT".into(),
            values: vec![30190],
            count: None,
            group_size: None,
            copies: Vec::new(),
        }],
        shards: vec![117],
        ..Default::default()
    });
    let injection = b.pod_injection(&pod("db-0")).unwrap();
    let ports = pod_ports(&b, &injection).unwrap();
    let mismatches = unheld_ports(&b, &ports, &shards);
    assert_eq!(mismatches.len(), 1);
    assert_eq!(mismatches[0].holder, PortHolder::Twice("ns/a".into()));
}

#[test]
fn an_owner_entry_that_does_not_decode_vouches_for_nothing() {
    let pool = pool_of(&["30000-30999"], &[]);
    let k = ShardKey::first(117);
    let pa = pa([30200, 30201], [30202, 30206], vec![117]);
    let (_, ports) = ports_of(&pa, 0);
    let shards = read(vec![(
        k,
        shard_in(&pool, k, vec![holder("a", "web.http=30200 garbage")]),
    )]);
    assert_eq!(unheld_ports(&pa, &ports, &shards).len(), ports.len());
}

#[test]
fn a_pod_without_ports_of_its_own_needs_no_shard() {
    let mut pa = pa([30200, 30201], [30202, 30206], vec![117]);
    pa.spec.roles[0].ports.clear();
    let (_, ports) = ports_of(&pa, 0);
    assert!(ports.is_empty());
    assert!(pod_port_shards(&ports).is_empty());
}

#[test]
fn ports_that_are_no_ports_are_a_denial_that_says_what_to_run() {
    let pa = pa([30200, 30201], [30202, 30206], vec![117]);
    let (mut injection, _) = ports_of(&pa, 0);
    for (first, count) in [(0, 1), (30200, 0), (65535, 2)] {
        injection.ports = vec![crate::api::PodPort {
            name: "http".into(),
            first,
            count,
        }];
        let error = pod_ports(&pa, &injection).unwrap_err().to_string();
        assert!(
            error.contains("kubectl portalloc sync a -n ns"),
            "{first}+{count}: {error}"
        );
    }
}

#[test]
fn a_hand_written_entry_over_the_whole_port_space_counts_in_its_window_only() {
    let pool = pool_of(&["30000-30999"], &[]);
    let k = ShardKey::first(117);
    let shards = read(vec![(
        k,
        shard_in(
            &pool,
            k,
            vec![
                holder("a", "web.http=30200,30201 web.nixl=30202-30205"),
                holder("c", "x.y=1-65535"),
            ],
        ),
    )]);
    let pa = pa([30200, 30201], [30202, 30100], vec![117]);
    let (_, ports) = ports_of(&pa, 0);
    let mismatches = unheld_ports(&pa, &ports, &shards);
    assert_eq!(mismatches.len(), 5);
    assert!(
        mismatches
            .iter()
            .all(|m| m.holder == PortHolder::Twice("ns/c".into()))
    );
}
