//! `pool upgrade` killed with SIGKILL part way, then run again: whatever the kill left (pool
//! untouched, frozen, some shards written, one created without its status, or done), the rerun
//! ends with the shards holding exactly the old list.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use kube::ResourceExt;
use portalloc::api::{PortPool, RecordFormat};
use rand::Rng;

use crate::shard_upgrade::{assert_upgraded, old_format_pool, old_holders, shards_of};
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
