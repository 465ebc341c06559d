//! A client killed between the shard writes of an owner that spans windows, against the real
//! API server. The allocator writes the owner's `status.shards` (the widening) before any
//! shard outside the shards its status names: that write is what lets the next `sync` find the
//! part written before the kill. Without it, the next sync decides in the home window alone
//! once that window has room, and the part stays behind: a slot held in two shards.
//!
//! A group commit (`sync --all`, the watcher) names a new owner in its home shard
//! (`status.elsewhere`) instead of widening its status; the second test shows that name doing
//! the widening's work.
//!
//! The kill is staged: the test decides the owner as the allocator does (`ledger::place`, or a
//! batch's pass 2), makes the writes the allocator makes up to the instant of the kill, and
//! stops.

use kube::ResourceExt;
use kube::api::{Api, PostParams};
use portalloc::api::{PortAllocation, PortPool};
use portalloc::core::Holdings;
use portalloc::k8s::ShardStore;
use portalloc::ledger::{
    BatchItem, ItemOutcome, Operation, Pass, PoolRecord, PoolSnapshot, ShardKey,
    decide_pool_batch_telling, home_shard, marking_writes, place, rebased, recorded_holdings,
    status_shards, window_of,
};

use crate::shard_repair::{create_allocation, holdings_in_shards, place as place_holdings, web};
use crate::support::{self, cli};

/// Windows 186 (47616-47871) and 187 (47872-48127).
const RANGE: &str = "47616-48127";

/// A client, a fresh namespace, and a pool of [`RANGE`] named after `prefix` (and its object).
async fn pool_of_two_windows(prefix: &str) -> (kube::Client, String, String, PortPool) {
    let client = support::client().await;
    let ns = support::namespace(&client, prefix).await;
    let pool = support::unique_name(prefix);
    support::create_pool(&pool, RANGE);
    let object = Api::<PortPool>::all(client.clone())
        .get(&pool)
        .await
        .unwrap();
    (client, ns, pool, object)
}

/// A PortAllocation name in `ns` whose home is the upper window, 187.
fn homed_in_upper_window(layout: &portalloc::ledger::WindowLayout, ns: &str) -> String {
    (0..)
        .map(|i| format!("o{i}"))
        .find(|name| home_shard(layout, &format!("{ns}/{name}")) == Some(187))
        .unwrap()
}

#[tokio::test]
async fn a_client_killed_between_its_shard_writes_leaves_parts_the_next_sync_completes() {
    let (client, ns, pool, object) = pool_of_two_windows("killed-between").await;
    let layout = PoolSnapshot::of_pool(&object).layout().unwrap();
    // The owner's home is the upper window, so the part written first (window 186, in
    // ascending order) lies outside it.
    let name = homed_in_upper_window(&layout, &ns);
    // 76 ports free in 186 and 56 in 187: 120 ports span both.
    let low = create_allocation(&client, &ns, "low", &pool, 180).await;
    let low_ports: Vec<u16> = (47616..47796).collect();
    place_holdings(&client, &pool, &low, &web(&low_ports)).await;
    let high = create_allocation(&client, &ns, "high", &pool, 200).await;
    let high_ports: Vec<u16> = (47872..48072).collect();
    place_holdings(&client, &pool, &high, &web(&high_ports)).await;
    let owner = create_allocation(&client, &ns, &name, &pool, 120).await;

    // The allocator's whole-pool path, up to the kill: decide, widen, first shard write.
    let store = ShardStore::new(client.clone());
    let record = PoolRecord::load(
        PoolSnapshot::of_pool(&object),
        store.list(&pool).await.unwrap(),
    )
    .unwrap();
    let item = BatchItem {
        uid: owner.uid().unwrap(),
        owner: format!("{ns}/{name}"),
        operation: Operation::sync_of(&owner),
        known: [ShardKey::first(187)].into(),
    };
    let placed = place(&record, &item, &mut rand::rng());
    let ItemOutcome::Changed { holdings, .. } = &placed.outcome else {
        panic!("{:?}", placed.outcome);
    };
    assert_eq!(placed.writes.len(), 2, "spans both windows");
    let widened = placed
        .widen
        .clone()
        .expect("a write outside the home window");
    let api: Api<PortAllocation> = Api::namespaced(client.clone(), &ns);
    let mut updated = owner.clone();
    updated.status.get_or_insert_default().shards = status_shards(&widened);
    api.replace_status(&name, &PostParams::default(), &updated)
        .await
        .unwrap();
    store
        .commit(&record.pool, &placed.writes[0])
        .await
        .map_err(|(e, _)| e)
        .unwrap();
    let written: Holdings = holdings
        .iter()
        .filter(|(_, block)| window_of(block.first) == 186)
        .map(|(slot, block)| (slot.clone(), block.first))
        .collect();
    assert!(!written.is_empty());

    // The home window gets room, then the owner is synced.
    let run = cli::run(&["delete", "high", "-n", &ns]);
    assert!(run.ok(), "{run}");
    let run = cli::run(&["sync", &name, "-n", &ns]);
    assert!(run.ok(), "{run}");

    // One entry per slot (no slot in two shards), what the status says, and the part written
    // before the kill kept where it was.
    let held = holdings_in_shards(&client, &pool).await;
    let mine = &held[&owner.uid().unwrap()];
    assert_eq!(mine.len(), 120, "{mine:?}");
    let status = api.get(&name).await.unwrap().status.unwrap();
    assert_eq!(&recorded_holdings(&status), mine);
    for (slot, block) in written.iter() {
        assert_eq!(mine.block(slot), Some(block), "{slot} moved");
    }
}

#[tokio::test]
async fn a_batch_killed_after_naming_an_owner_in_its_home_leaves_parts_the_next_sync_keeps() {
    let (client, ns, pool, object) = pool_of_two_windows("killed-batch").await;
    let layout = PoolSnapshot::of_pool(&object).layout().unwrap();
    let name = homed_in_upper_window(&layout, &ns);
    // 56 ports free in its home (187), 76 in 186: its 60 go to 186 alone.
    let high = create_allocation(&client, &ns, "high", &pool, 200).await;
    let high_ports: Vec<u16> = (47872..48072).collect();
    place_holdings(&client, &pool, &high, &web(&high_ports)).await;
    let low = create_allocation(&client, &ns, "low", &pool, 180).await;
    let low_ports: Vec<u16> = (47616..47796).collect();
    place_holdings(&client, &pool, &low, &web(&low_ports)).await;
    let owner = create_allocation(&client, &ns, &name, &pool, 60).await;

    // A batch's pass 2, up to the kill: the owner named in its home shard, then its entries
    // written in 186, and no status write at all.
    let store = ShardStore::new(client.clone());
    let record = PoolRecord::load(
        PoolSnapshot::of_pool(&object),
        store.list(&pool).await.unwrap(),
    )
    .unwrap();
    let home = ShardKey::first(187);
    let item = BatchItem {
        uid: owner.uid().unwrap(),
        owner: format!("{ns}/{name}"),
        operation: Operation::sync_of(&owner),
        known: [home].into(),
    };
    let batch = decide_pool_batch_telling(
        &record,
        std::slice::from_ref(&item),
        (Pass::Anywhere, &[Some(home)]),
        false,
        &mut rand::rng(),
        |_, _| panic!("no status is widened"),
    );
    assert_eq!(batch.marked, [(0, home)]);
    let ItemOutcome::Changed { holdings, .. } = batch.outcomes[0].clone().unwrap() else {
        panic!("{:?}", batch.outcomes[0]);
    };
    assert!(holdings.iter().all(|(_, b)| window_of(b.first) == 186));
    let marking = marking_writes(&record, [(item.uid.as_str(), item.owner.as_str(), home)]);
    let mut after = record.clone();
    for write in &marking {
        after.replace(
            store
                .commit(&record.pool, write)
                .await
                .map_err(|(e, _)| e)
                .unwrap(),
        );
    }
    let writes = rebased(&batch.writes, &marking, &after);
    assert_eq!(writes.len(), 1, "the entries' write alone: {writes:?}");
    store
        .commit(&record.pool, &writes[0])
        .await
        .map_err(|(e, _)| e)
        .unwrap();

    // Its home gets room, then the owner is synced alone: its home names it, so the sync reads
    // the whole pool and keeps what the batch wrote (read in its home alone, it would take 60
    // ports there and hold 120).
    let run = cli::run(&["delete", "high", "-n", &ns]);
    assert!(run.ok(), "{run}");
    let run = cli::run(&["sync", &name, "-n", &ns]);
    assert!(run.ok(), "{run}");
    let held = holdings_in_shards(&client, &pool).await;
    let mine = &held[&owner.uid().unwrap()];
    assert_eq!(mine, &holdings, "kept where the batch wrote it");
    let api: Api<PortAllocation> = Api::namespaced(client.clone(), &ns);
    let status = api.get(&name).await.unwrap().status.unwrap();
    assert_eq!(&recorded_holdings(&status), mine);

    // Its status names its shards now, so the name is not needed: repair removes it.
    let named = |shards: Vec<portalloc::api::PortPoolShard>| {
        shards
            .iter()
            .flat_map(|s| s.status.iter().flat_map(|st| st.elsewhere.clone()))
            .count()
    };
    assert_eq!(named(store.list(&pool).await.unwrap()), 1);
    let run = cli::run(&["repair", "--pool", &pool, "--apply"]);
    assert!(run.ok(), "{run}");
    assert!(run.stdout.contains("unmark"), "{run}");
    assert_eq!(named(store.list(&pool).await.unwrap()), 0);
}
