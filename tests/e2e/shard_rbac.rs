//! The roles and the tenancy policies of rbac/ over a pool's PortPoolShards, with the
//! control plane's unprivileged certificate identities: tenant A (`portalloc-user` in tenant-a,
//! `portalloc-pool-user` cluster-wide) and an administrator (`portalloc-admin`). Shard writes are
//! built by the pure ledger (`CopyRecord::writes_for`) and committed by `ShardStore::commit`,
//! the allocator's own path: a lazy create of the window's shard, then its status CAS. Last, the
//! tenant runs the plugin itself on the pool, under the policies.
//!
//! A control plane of its own: the policies would change what the other tests may do.

mod cel_cost;
mod writes;

use kube::api::{Api, PostParams};
use portalloc::api::{PoolHolder, PortAllocation, PortPool, PortPoolShard, PortPoolShardStatus};
use portalloc::k8s::ShardStore;
use portalloc::ledger::{
    Anomaly, CopyRecord, PoolSnapshot, ShardAnomaly, ShardKey, new_shard, shard_name,
};

use crate::support::apply::{apply_yaml, bind, create_namespace};
use crate::support::invariants::assert_consistent;
use crate::support::poll::until_refused;
use crate::support::private_cluster::{PrivateCluster, client_from};
use crate::support::{self, USER_CONTEXT};

use writes::{allowed, assert_holders_refusal, dry_run, file, owners, read, set_holdings};

const ADMIN_CONTEXT: &str = "portalloc-local-user2";
const ADMIN_NAME: &str = "portalloc-user2";
const TENANT_NAME: &str = support::USER_NAME;
/// 23300-24000: windows 91 (23296-23551), 92 (23552-23807) and 93 (23808-24063).
const POOL: &str = "gpu";

#[tokio::test]
async fn the_tenancy_policy_confines_a_tenant_to_its_own_shard_entries() {
    let Some(cluster) = PrivateCluster::start("shard-tenancy", true) else {
        return;
    };
    let root = cluster.client().await;
    apply_yaml(&root, &file("rbac", "portalloc-user.yaml"), None).await;
    apply_yaml(&root, &file("rbac", "portalloc-admin.yaml"), None).await;
    for ns in ["tenant-a", "tenant-b"] {
        create_namespace(&root, ns).await;
    }
    bind(
        &root,
        "portalloc-user",
        "portalloc-user",
        TENANT_NAME,
        Some("tenant-a"),
    )
    .await;
    bind(
        &root,
        "portalloc-pool-user",
        "portalloc-pool-user",
        TENANT_NAME,
        None,
    )
    .await;
    bind(
        &root,
        "portalloc-admin",
        "portalloc-admin",
        ADMIN_NAME,
        None,
    )
    .await;
    assert!(
        cluster
            .run(&["pool", "create", POOL, "--range", "23300-24000"])
            .ok()
    );
    let tenant = client_from(&cluster.kubeconfig, Some(USER_CONTEXT)).await;
    let admin = client_from(&cluster.kubeconfig, Some(ADMIN_CONTEXT)).await;
    let shards_as_tenant = Api::<PortPoolShard>::all(tenant.clone());

    // The user roles are enough for the allocator's sharded path: list, lazy create, status CAS.
    set_holdings(&tenant, "ua", "tenant-a/a", "web.http=23301")
        .await
        .expect("the tenant creates window 91's shard and writes its entry");
    assert_eq!(owners(&root, 91).await, ["tenant-a/a"]);
    // ...and without the policy, RBAC lets the tenant write anybody's entries.
    set_holdings(&tenant, "ub", "tenant-b/b", "db.sql=23302")
        .await
        .expect("RBAC alone lets a tenant write another namespace's entry");
    set_holdings(&root, "ub", "tenant-b/b", "").await.unwrap();
    // Shard specs and deletion are the administrators'.
    let gpu91 = shard_name(POOL, ShardKey::first(91));
    let err = shards_as_tenant
        .delete(&gpu91, &Default::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 403),
        "{err}"
    );
    // In words, once, naming the role that grants it (the administrators').
    let refusal = portalloc::k8s::KubeError::from_kube(
        err,
        portalloc::k8s::SHARDS.on("delete", &gpu91, None),
    )
    .to_string();
    crate::support::error_text::assert_clean("delete a shard as a tenant", &refusal);
    assert!(
        refusal.contains("ClusterRole portalloc-admin (rbac/portalloc-admin.yaml)")
            && !refusal.contains("ClusterRole portalloc-pool-user"),
        "{refusal}"
    );
    let mut object = shards_as_tenant.get(&gpu91).await.unwrap();
    object.metadata.labels = Some([("x".to_string(), "y".to_string())].into());
    let err = shards_as_tenant
        .replace(&gpu91, &PostParams::default(), &object)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 403),
        "{err}"
    );

    // The policies, once the API server enforces each of them (dry runs persist nothing).
    apply_yaml(&root, &file("rbac", "portalloc-tenancy-policy.yaml"), None).await;
    let probe = PoolHolder {
        uid: "00000000-0000-0000-0000-00000000beef".into(),
        owner: "tenant-b/probe".into(),
        ports: "x.y=23303".into(),
    };
    let denial = until_refused("portalloc-pool-holders", || async {
        let mut shard = shards_as_tenant.get(&gpu91).await.unwrap();
        let status = shard.status.get_or_insert_with(Default::default);
        status.holders.push(probe.clone());
        shards_as_tenant
            .replace_status(&gpu91, &dry_run(), &shard)
            .await
            .map(|_| ())
    })
    .await;
    assert_holders_refusal(&denial, &gpu91, "tenant-b/probe");
    let pools_as_tenant = Api::<PortPool>::all(tenant.clone());
    // The copy of the pool's spec a shard carries is the administrators': a tenant's wider copy
    // would make clients that read only the shard hand out ports the pool excludes.
    let copy_denial = until_refused("the spec copy rule", || async {
        let mut shard = shards_as_tenant.get(&gpu91).await.unwrap();
        let status = shard.status.get_or_insert_with(Default::default);
        status.pool_generation += 1;
        if let Some(spec) = status.pool_spec.as_mut() {
            spec.ranges.push("23296-23299".into());
        }
        shards_as_tenant
            .replace_status(&gpu91, &dry_run(), &shard)
            .await
            .map(|_| ())
    })
    .await;
    assert!(
        copy_denial.contains("ValidatingAdmissionPolicy 'portalloc-pool-holders'")
            && copy_denial.contains(&format!(
                "may change the copy of the pool spec PortPoolShard {gpu91} carries"
            )),
        "{copy_denial}"
    );
    let name_denial = until_refused("portalloc-shard-names", || async {
        let pool = pools_as_tenant.get(POOL).await.unwrap();
        let mut shard = new_shard(&PoolSnapshot::of_pool(&pool), ShardKey::first(91));
        // Sorts before gpu-91: a reader would take it for window 91's record.
        shard.metadata.name = Some("a-rival".into());
        shards_as_tenant
            .create(&dry_run(), &shard)
            .await
            .map(|_| ())
    })
    .await;
    assert!(
        name_denial.contains("ValidatingAdmissionPolicy 'portalloc-shard-names'")
            && name_denial.contains("for window 91 is named gpu-91, not a-rival"),
        "{name_denial}"
    );

    // A pool name too long for `<pool>-<index>`: the ledger's hashed name passes, names of
    // another shape do not.
    let mut long_pool = pools_as_tenant.get(POOL).await.unwrap();
    let long = "p".repeat(252);
    long_pool.metadata.name = Some(long.clone());
    let hashed = new_shard(&PoolSnapshot::of_pool(&long_pool), ShardKey::first(91));
    assert_ne!(hashed.metadata.name, Some(format!("{long}-91")));
    shards_as_tenant
        .create(&dry_run(), &hashed)
        .await
        .expect("the hashed name of a long pool name");
    for name in [
        format!("{}-91", &long[..200]),
        format!("{}-0123abcd-91", "q".repeat(240)),
        format!("{}-0123abcd-92", &long[..240]),
    ] {
        let mut other = hashed.clone();
        other.metadata.name = Some(name.clone());
        let err = shards_as_tenant
            .create(&dry_run(), &other)
            .await
            .unwrap_err()
            .to_string();
        // Refused by the rule, not by an error evaluating it.
        assert!(
            err.contains("'portalloc-shard-names'")
                && err.contains("denied request: a PortPoolShard of pool ppp"),
            "{name}: {err}"
        );
    }

    // A tenant's own entries: added to an existing shard, and into a window with no shard yet.
    set_holdings(&tenant, "ua", "tenant-a/a", "web.http=23301 web.grpc=23310")
        .await
        .expect("own namespace, existing shard");
    set_holdings(&tenant, "ua2", "tenant-a/a2", "web.http=23600")
        .await
        .expect("own namespace, another shard");
    assert_eq!(owners(&root, 92).await, ["tenant-a/a2"]);

    // Another namespace's entry: adding is refused; an administrator may; then changing or
    // removing it is refused to the tenant.
    let err = set_holdings(&tenant, "ub", "tenant-b/b", "db.sql=23302")
        .await
        .unwrap_err()
        .to_string();
    assert_holders_refusal(&err, &gpu91, "tenant-b/b");
    assert_eq!(owners(&root, 91).await, ["tenant-a/a"]);
    set_holdings(&admin, "ub", "tenant-b/b", "db.sql=23302")
        .await
        .expect("an administrator adds any entry");
    let with_b = owners(&root, 91).await;
    assert_eq!(with_b.len(), 2, "{with_b:?}");
    for ports in ["db.sql=23304", ""] {
        let err = set_holdings(&tenant, "ub", "tenant-b/b", ports)
            .await
            .unwrap_err()
            .to_string();
        assert_holders_refusal(&err, &gpu91, "tenant-b/b");
    }
    assert_eq!(owners(&root, 91).await, with_b, "nothing changed");

    // Nor may the tenant list another tenant's port in its own entries: the pod webhook denies a
    // port two entries list to the pods of both owners. A port, a block over it, a new entry.
    for (uid, owner, ports) in [
        ("ua", "tenant-a/a", "web.http=23301 web.grpc=23310,23302"),
        (
            "ua",
            "tenant-a/a",
            "web.http=23301 web.grpc=23310 web.nixl=23300-23303",
        ),
        ("ua3", "tenant-a/a3", "x.y=23302"),
    ] {
        let err = set_holdings(&tenant, uid, owner, ports)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("ValidatingAdmissionPolicy 'portalloc-pool-holders'")
                && err.contains(&format!(
                    "PortPoolShard {gpu91}: this update lists port 23302 of PortAllocation \
                     {owner}, which PortAllocation tenant-b/b holds"
                ))
                && err.contains("kubectl portalloc repair --pool gpu"),
            "{ports}: {err}"
        );
    }
    // Nor write an entry under another entry's UID (the allocator and the webhook find an
    // owner's entry by UID), or one the allocator cannot read (it would take that entry to hold
    // nothing and could hand its ports to another tenant, whose write the rule above refuses).
    let raw = |uid: &str, owner: &str, ports: &str| PoolHolder {
        uid: uid.into(),
        owner: owner.into(),
        ports: ports.into(),
    };
    for (holder, expected) in [
        (
            raw("ub", "tenant-a/spoof", ""),
            "the entry of tenant-a/spoof has UID ub, as the entry of tenant-b/b does",
        ),
        (
            raw("ua9", "tenant-a/a9", "x.y=23400 x.y=23401"),
            "the entry of tenant-a/a9 does not read as holdings",
        ),
        (
            raw("ua9", "tenant-a/a9", "x.y=23400,23405-23401"),
            "the entry of tenant-a/a9 does not read as holdings",
        ),
        (
            raw("ua9", "tenant-a/a9", "x.y=023302"),
            "this update lists port 23302 of PortAllocation tenant-a/a9",
        ),
    ] {
        let mut shard = shards_as_tenant.get(&gpu91).await.unwrap();
        let status = shard.status.get_or_insert_with(Default::default);
        status.holders.push(holder.clone());
        let err = shards_as_tenant
            .replace_status(&gpu91, &PostParams::default(), &shard)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("'portalloc-pool-holders'") && err.contains(expected),
            "{holder:?}: {err}"
        );
    }
    assert_eq!(owners(&root, 91).await, with_b, "nothing changed");
    let a_holds = read(&root).await.holdings_of("ua").encode();
    assert_eq!(a_holds, "web.grpc=23310 web.http=23301");
    // A pool administrator may list a port twice (repair writes any entry); the record then
    // reports it, and the tenant may still remove its own entry.
    let admin_shards = Api::<PortPoolShard>::all(admin.clone());
    let mut shard = admin_shards.get(&gpu91).await.unwrap();
    let status = shard.status.get_or_insert_with(Default::default);
    status.holders.push(raw("ua3", "tenant-a/a3", "x.y=23302"));
    admin_shards
        .replace_status(&gpu91, &PostParams::default(), &shard)
        .await
        .expect("a pool administrator lists a port twice");
    let pool = Api::<PortPool>::all(root.clone()).get(POOL).await.unwrap();
    let shards = ShardStore::new(root.clone()).list(POOL).await.unwrap();
    let twice = CopyRecord::load(PoolSnapshot::of_pool(&pool), shards).unwrap();
    assert!(
        twice.anomalies.iter().any(|a| matches!(
            a,
            ShardAnomaly::InShard {
                anomaly: Anomaly::Duplicate { port: 23302, .. },
                ..
            }
        )),
        "{:?}",
        twice.anomalies
    );
    let mut shard = shards_as_tenant.get(&gpu91).await.unwrap();
    let status = shard.status.get_or_insert_with(Default::default);
    status.holders.retain(|h| h.uid != "ua3");
    shards_as_tenant
        .replace_status(&gpu91, &PostParams::default(), &shard)
        .await
        .expect("a tenant removes its own entry that lists a port twice");
    assert_eq!(owners(&root, 91).await, with_b);

    // A new shard: its spec must be its window's; the status of a create is dropped by the
    // API server, so a foreign entry in it is no way around the policy: the status write that
    // follows is what is checked.
    let pool = pools_as_tenant.get(POOL).await.unwrap();
    let gpu93 = shard_name(POOL, ShardKey::first(93));
    // `pool create` made every window's shard: remove 93's to create it again as a tenant would
    // for a pool applied with kubectl.
    Api::<PortPoolShard>::all(root.clone())
        .delete(&gpu93, &Default::default())
        .await
        .unwrap();
    let mut narrow = new_shard(&PoolSnapshot::of_pool(&pool), ShardKey::first(93));
    narrow.spec.ranges = vec!["23808-23900".into()];
    let err = shards_as_tenant
        .create(&PostParams::default(), &narrow)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("'portalloc-shard-names'")
            && err.contains("its spec.ranges is [\"23808-24063\"]"),
        "{err}"
    );
    let foreign = PoolHolder {
        uid: "ub3".into(),
        owner: "tenant-b/b3".into(),
        ports: "db.sql=23810".into(),
    };
    let mut with_status = new_shard(&PoolSnapshot::of_pool(&pool), ShardKey::first(93));
    with_status.status = Some(PortPoolShardStatus {
        holders: vec![foreign.clone()],
        ..Default::default()
    });
    let created = shards_as_tenant
        .create(&PostParams::default(), &with_status)
        .await
        .expect("a create carries no holders");
    assert_eq!(created.status.unwrap_or_default().holders, []);
    let mut again = shards_as_tenant.get(&gpu93).await.unwrap();
    again.status.get_or_insert_with(Default::default).holders = vec![foreign];
    let err = shards_as_tenant
        .replace_status(&gpu93, &PostParams::default(), &again)
        .await
        .unwrap_err()
        .to_string();
    assert_holders_refusal(&err, &gpu93, "tenant-b/b3");
    assert_eq!(owners(&root, 93).await, Vec::<String>::new());
    // A status write that changes no entry (the new shard's counts) passes.
    let counted = read(&tenant).await.shards[&93].record.current_status();
    let mut counts = shards_as_tenant.get(&gpu93).await.unwrap();
    counts.status = Some(counted);
    shards_as_tenant
        .replace_status(&gpu93, &PostParams::default(), &counts)
        .await
        .expect("no entry changed");
    // The shard policy binds administrators too: a misnamed shard is wrong for every reader.
    let mut misnamed = new_shard(&PoolSnapshot::of_pool(&pool), ShardKey::first(93));
    misnamed.metadata.name = Some("a-rival".into());
    let err = Api::<PortPoolShard>::all(admin.clone())
        .create(&dry_run(), &misnamed)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("is named gpu-93, not a-rival"), "{err}");

    // An administrator carries a new spec to a shard; a tenant's write that keeps the copy
    // passes (every write above kept it).
    let shards_as_admin = Api::<PortPoolShard>::all(admin.clone());
    let mut carried = shards_as_admin.get(&gpu91).await.unwrap();
    carried.status.as_mut().unwrap().pool_generation += 1;
    shards_as_admin
        .replace_status(&gpu91, &dry_run(), &carried)
        .await
        .expect("an administrator carries a new spec");
    set_holdings(&tenant, "ua", "tenant-a/a", "")
        .await
        .expect("a tenant removes its own entry");

    // Administrators change and remove any entry (repair).
    set_holdings(&admin, "ub", "tenant-b/b", "db.sql=23305")
        .await
        .expect("admin changes");
    set_holdings(&admin, "ub", "tenant-b/b", "")
        .await
        .expect("admin removes");
    assert_eq!(owners(&root, 91).await, Vec::<String>::new());
    assert_eq!(owners(&root, 92).await, ["tenant-a/a2"]);
    set_holdings(&tenant, "ua2", "tenant-a/a2", "")
        .await
        .expect("a tenant removes its own entry");

    // The plugin's sharded path as the tenant, under the policies: an owner of 300 ports (more
    // than a window, so it spans shards) created, resynced, released and deleted.
    let manifest = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        manifest.path(),
        support::simple_allocation("big", POOL, "worker", 300, &["rpc"]),
    )
    .unwrap();
    let path = manifest.path().to_str().unwrap();
    for args in [
        vec!["create", "-n", "tenant-a", "-f", path],
        vec!["sync", "big", "-n", "tenant-a"],
    ] {
        let run = cluster.run(&[&["--context", USER_CONTEXT], &args[..]].concat());
        assert!(run.ok(), "{args:?}: {run}");
    }
    let held = assert_consistent(&root, POOL).await;
    assert_eq!(held.values().map(|h| h.len()).sum::<usize>(), 300);
    let record = read(&root).await;
    let (uid, _) = held.iter().next().unwrap();
    let parts = record.shards_of(uid);
    assert!(parts.len() >= 2, "300 ports in windows {parts:?}");
    for args in [
        vec!["release", "big", "-n", "tenant-a"],
        vec!["sync", "big", "-n", "tenant-a"],
        vec!["delete", "big", "-n", "tenant-a"],
    ] {
        let run = cluster.run(&[&["--context", USER_CONTEXT], &args[..]].concat());
        assert!(run.ok(), "{args:?}: {run}");
    }
    assert!(read(&root).await.shards_of(uid).is_empty());
    assert!(assert_consistent(&root, POOL).await.is_empty());

    // Group commit as the tenant: `sync --all` writes each shard once for every PortAllocation of
    // the namespace that changes in it, so one write adds several entries (an authorizer check
    // costs 350,000 of the 1,000,000 one CEL expression may spend: the policy checks a namespace
    // once, not each entry). A pool of one window, so that every entry is in one shard.
    assert!(
        cluster
            .run(&["pool", "create", "solo", "--range", "24100-24150"])
            .ok()
    );
    let allocations = Api::<PortAllocation>::namespaced(tenant.clone(), "tenant-a");
    let names = ["g1", "g2", "g3", "g4"];
    for name in names {
        let yaml = support::simple_allocation(name, "solo", "web", 2, &["http"]);
        let pa: PortAllocation = serde_yaml::from_str(&yaml).unwrap();
        allocations
            .create(&PostParams::default(), &pa)
            .await
            .unwrap();
    }
    for args in [
        vec!["sync", "--all", "-n", "tenant-a"],
        vec!["release", "g1", "-n", "tenant-a"],
        vec!["release", "g2", "-n", "tenant-a"],
        vec!["sync", "--all", "-n", "tenant-a"],
    ] {
        let run = cluster.run(&[&["--context", USER_CONTEXT], &args[..]].concat());
        assert!(run.ok(), "{args:?}: {run}");
    }
    let held = assert_consistent(&root, "solo").await;
    assert_eq!(held.values().map(|h| h.len()).sum::<usize>(), 8, "{held:?}");
    let solo = Api::<PortPoolShard>::all(root.clone())
        .list(&Default::default())
        .await
        .unwrap();
    let solo: Vec<_> = solo
        .items
        .iter()
        .filter(|s| s.spec.pool == "solo")
        .collect();
    assert_eq!(solo.len(), 1, "one window");
    for name in names {
        let run = cluster.run(&["--context", USER_CONTEXT, "delete", name, "-n", "tenant-a"]);
        assert!(run.ok(), "{run}");
    }
    assert!(assert_consistent(&root, "solo").await.is_empty());

    // A workload bigger than one copy, as the tenant: its pods spread over both copies of a
    // pool with reuse, each copy's shard written under the policy like any other.
    assert!(
        cluster
            .run(&[
                "pool",
                "create",
                "spread",
                "--range",
                "24200-24203",
                "--node-reuse",
                "2"
            ])
            .ok()
    );
    std::fs::write(
        manifest.path(),
        support::simple_allocation("wide", "spread", "web", 3, &["http", "nccl"]),
    )
    .unwrap();
    let run = cluster.run(&[
        "--context",
        USER_CONTEXT,
        "create",
        "-n",
        "tenant-a",
        "-f",
        path,
    ]);
    assert!(run.ok(), "{run}");
    let wide = assert_consistent(&root, "spread").await;
    assert_eq!(wide.values().map(|h| h.len()).sum::<usize>(), 6, "{wide:?}");
    let spread = crate::support::invariants::pool_record(&root, "spread").await;
    assert_eq!(spread.copies_in_use(), [0, 1].into());
    let run = cluster.run(&[
        "--context",
        USER_CONTEXT,
        "delete",
        "wide",
        "-n",
        "tenant-a",
    ]);
    assert!(run.ok(), "{run}");
    assert!(assert_consistent(&root, "spread").await.is_empty());

    // The heaviest record a window holds, 256 one-port entries (what the policy's rules cost
    // grows with the entries and values of the shard written): a tenant's allocation in it
    // passes within the API server's CEL cost limits, and a clash there is refused by the rule,
    // not by an exhausted budget.
    let gpu92 = shard_name(POOL, ShardKey::first(92));
    let mut full = shards_as_admin.get(&gpu92).await.unwrap();
    full.status.get_or_insert_with(Default::default).holders = (0..255u16)
        .map(|i| PoolHolder {
            uid: format!("ub-{i}"),
            owner: format!("tenant-b/b{i}"),
            ports: format!("web.http={}", 23552 + i),
        })
        .collect();
    shards_as_admin
        .replace_status(&gpu92, &PostParams::default(), &full)
        .await
        .unwrap();
    set_holdings(&tenant, "ua-last", "tenant-a/last", "web.http=23807")
        .await
        .expect("the last free port of a full window");
    let err = set_holdings(&tenant, "ua-last", "tenant-a/last", "web.http=23807,23700")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!(
            "PortPoolShard {gpu92}: this update lists port 23700 of PortAllocation \
             tenant-a/last, which PortAllocation tenant-b/b148 holds"
        )),
        "{err}"
    );
    set_holdings(&tenant, "ua-last", "tenant-a/last", "")
        .await
        .expect("a tenant removes its own entry from a full window");
    let mut emptied = shards_as_admin.get(&gpu92).await.unwrap();
    emptied.status.get_or_insert_with(Default::default).holders = vec![];
    shards_as_admin
        .replace_status(&gpu92, &PostParams::default(), &emptied)
        .await
        .unwrap();

    // The watcher's ServiceAccount has on shards what an allocating user has, update (an
    // administrator to the tenancy policy: it carries specs and frees leaks) and delete (its
    // repair pass removes the shards an earlier pool of the same name left).
    apply_yaml(&root, &file("deploy", "watcher.yaml"), None).await;
    let watcher = (
        "system:serviceaccount:portalloc-system:portalloc-watcher",
        vec![
            "system:serviceaccounts".to_string(),
            "system:serviceaccounts:portalloc-system".to_string(),
        ],
    );
    let user = (TENANT_NAME, vec!["system:authenticated".to_string()]);
    for (verb, subresource, for_user, for_watcher) in [
        ("get", "", true, true),
        ("list", "", true, true),
        ("watch", "", true, true),
        ("create", "", true, true),
        ("update", "status", true, true),
        ("get", "status", true, true),
        ("delete", "", false, true),
        ("update", "", false, true),
        ("patch", "", false, false),
        ("patch", "status", false, false),
    ] {
        for ((name, groups), expected) in [(&user, for_user), (&watcher, for_watcher)] {
            assert_eq!(
                allowed(&root, name, groups, verb, subresource).await,
                expected,
                "{name}: {verb} portpoolshards/{subresource}"
            );
        }
    }
    eprintln!("shard tenancy: {denial}\n{copy_denial}\n{name_denial}");
}
