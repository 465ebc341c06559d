//! Upgrades that are interrupted or raced:
//! - `pool upgrade` killed with SIGKILL part way, then run again: whatever the kill left (pool
//!   untouched, frozen, some shards written, one created without its status, or done), the
//!   rerun ends with the shards holding exactly the old list;
//! - `pool create --sharded` raced by a client of today's format that writes holders into the
//!   new pool before its status says Sharded: the create upgrades the pool instead, holders and
//!   all.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use portalloc::api::{PortPool, RecordFormat};
use portalloc::ledger::PoolRecord;
use rand::Rng;

use crate::shard_upgrade::{RANGES, assert_upgraded, old_format_pool, old_holders, shards_of};
use crate::support::{self, cli};

const TRIALS: usize = 12;

/// Run `pool upgrade NAME -v 2` and SIGKILL it once it has logged `requests` API requests.
fn upgrade_killed_after(name: &str, requests: usize) {
    let mut child = Command::new(cli::BIN)
        .args(["pool", "upgrade", name, "-v", "2"])
        .env("KUBECONFIG", &support::cluster().kubeconfig)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn kubectl-portalloc");
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let mut seen = 0;
    for line in stderr.lines() {
        // -v 2 logs one line per request: `PUT /apis/portalloc.dev/... 200 4.1ms`.
        if line.unwrap().contains(" /apis/") {
            seen += 1;
            if seen == requests {
                break;
            }
        }
    }
    // Already gone when it made fewer requests than that: nothing to kill.
    let _ = child.kill();
    let _ = child.wait();
}

#[tokio::test]
async fn an_upgrade_killed_at_any_request_is_finished_by_the_next_run() {
    let client = support::client().await;
    let mut rng = rand::rng();
    let mut left: BTreeMap<String, usize> = BTreeMap::new();
    for trial in 0..TRIALS {
        let before = old_format_pool(&client, &format!("kill-{trial}"), old_holders()).await;
        let name = before.name_any();
        // An upgrade of 11 shards makes about 37 requests (GET, LIST, freeze, 3 per shard, flip).
        upgrade_killed_after(&name, rng.random_range(1..=36));

        let pool = kube::Api::<PortPool>::all(client.clone())
            .get(&name)
            .await
            .unwrap();
        let format = pool.status.as_ref().and_then(|s| s.format);
        let shards = shards_of(&client, &name).await;
        let unwritten = shards.iter().filter(|s| s.status.is_none()).count();
        let state = match format {
            None => "untouched".to_string(),
            Some(RecordFormat::Migrating) => {
                format!(
                    "Migrating, {} shards ({unwritten} without status)",
                    shards.len()
                )
            }
            Some(RecordFormat::Sharded) => "Sharded".to_string(),
        };
        *left.entry(state).or_default() += 1;
        if format.is_none() {
            assert!(shards.is_empty(), "nothing is copied before the freeze");
        }

        let run = cli::run(&["pool", "upgrade", &name]);
        assert!(run.ok(), "{run}");
        assert_upgraded(&client, &before).await;
    }
    eprintln!("states the kills left: {left:?}");
    assert!(
        left.keys().any(|state| state.starts_with("Migrating")),
        "no kill landed between freeze and flip: {left:?}"
    );
}

/// What a client of today's format does to a pool it finds: write its holders into the
/// one-object record, by a CAS on the version it read. Polls until the pool exists; returns the
/// pool as written, or None when its write lost (the pool already said Sharded, or changed).
async fn old_client_writes_as_soon_as_it_exists(client: Client, name: String) -> Option<PortPool> {
    let pools: Api<PortPool> = Api::all(client);
    let mut object = loop {
        if let Some(object) = pools.get_opt(&name).await.unwrap() {
            break object;
        }
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    };
    let mut status = object.status.clone().unwrap_or_default();
    status.format = None;
    status.holders = old_holders();
    object.status = Some(status);
    object.status = Some(PoolRecord::load(object.clone()).unwrap().current_status());
    pools
        .replace_status(&name, &PostParams::default(), &object)
        .await
        .ok()
}

#[tokio::test]
async fn a_pool_created_sharded_and_written_by_an_old_client_meanwhile_is_upgraded() {
    let client = support::client().await;
    let mut won = 0;
    for trial in 0..5 {
        let name = support::unique_name(&format!("create-race-{trial}"));
        let writer = tokio::spawn(old_client_writes_as_soon_as_it_exists(
            client.clone(),
            name.clone(),
        ));
        let args = [
            "pool",
            "create",
            &name,
            "--range",
            RANGES,
            "--allow-overlap",
            "--sharded",
        ];
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let run = tokio::task::spawn_blocking(move || {
            cli::run(&args.iter().map(String::as_str).collect::<Vec<_>>())
        })
        .await
        .unwrap();
        assert!(run.ok(), "{run}");
        match writer.await.unwrap() {
            // Its holders were written into the one-object record first: the shards hold them.
            Some(written) => {
                won += 1;
                assert_upgraded(&client, &written).await;
            }
            None => {
                let shards = shards_of(&client, &name).await;
                assert_eq!(shards.len(), 11);
                assert!(
                    shards
                        .iter()
                        .all(|s| s.status.as_ref().is_some_and(|s| s.holders.is_empty()))
                );
            }
        }
        let pool = Api::<PortPool>::all(client.clone())
            .get(&name)
            .await
            .unwrap();
        assert_eq!(pool.status.unwrap().format, Some(RecordFormat::Sharded));
        if won > 0 {
            break;
        }
    }
    assert!(
        won > 0,
        "the old client never wrote before the create finished"
    );
}
