//! What the shard-RBAC test does as each identity: read the pool's record, commit the ledger's
//! shard writes, list a shard's owners, ask the authorizer.

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, PostParams};
use portalloc::api::{PortPool, PortPoolShard};
use portalloc::core::Holdings;
use portalloc::k8s::ShardStore;
use portalloc::ledger::{CopyRecord, PoolSnapshot, ShardKey, shard_name};

use super::POOL;
use crate::support;

pub(super) fn file(dir: &str, name: &str) -> String {
    std::fs::read_to_string(support::repo_root().join(dir).join(name)).unwrap()
}

pub(super) fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        ..Default::default()
    }
}

pub(super) async fn read(client: &Client) -> CopyRecord {
    let pool = Api::<PortPool>::all(client.clone())
        .get(POOL)
        .await
        .unwrap();
    let shards = ShardStore::new(client.clone()).list(POOL).await.unwrap();
    let record = CopyRecord::load(PoolSnapshot::of_pool(&pool), shards).unwrap();
    assert!(record.anomalies.is_empty(), "{:?}", record.anomalies);
    record
}

/// Make `uid`'s holdings in the pool exactly `ports` ("" for none), as `client`'s user: the
/// ledger's per-shard writes, committed in order; the first refusal stops them.
pub(super) async fn set_holdings(
    client: &Client,
    uid: &str,
    owner: &str,
    ports: &str,
) -> Result<(), kube::Error> {
    let record = read(client).await;
    let decided = if ports.is_empty() {
        Holdings::new()
    } else {
        Holdings::decode(ports).unwrap()
    };
    let writes = record.writes_for(uid, owner, &decided);
    assert!(!writes.is_empty(), "{owner} {ports:?} changes nothing");
    let store = ShardStore::new(client.clone());
    for write in &writes {
        store
            .commit(&record.pool, write)
            .await
            .map_err(|(e, _)| e)?;
    }
    Ok(())
}

/// The owners listed in window `index`'s shard, in order.
pub(super) async fn owners(client: &Client, index: u16) -> Vec<String> {
    let shard = Api::<PortPoolShard>::all(client.clone())
        .get(&shard_name(POOL, ShardKey::first(index)))
        .await
        .unwrap();
    let holders = shard.status.unwrap_or_default().holders;
    holders.into_iter().map(|h| h.owner).collect()
}

pub(super) fn assert_holders_refusal(error: &str, shard: &str, touched: &str) {
    assert!(
        error.contains("ValidatingAdmissionPolicy 'portalloc-pool-holders'")
            && error.contains(&format!("holders of PortPoolShard {shard} only"))
            && error.contains("only for namespaces in which you may update portallocations")
            && error.contains(&format!("this update touches: {touched}")),
        "{error}"
    );
}

/// Whether `user` may `verb` portpoolshards (`subresource`), by the API server's authorizer.
pub(super) async fn allowed(
    client: &Client,
    user: &str,
    groups: &[String],
    verb: &str,
    subresource: &str,
) -> bool {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.to_string()),
            groups: Some(groups.to_vec()),
            resource_attributes: Some(ResourceAttributes {
                group: Some("portalloc.dev".into()),
                resource: Some("portpoolshards".into()),
                subresource: (!subresource.is_empty()).then(|| subresource.to_string()),
                verb: Some(verb.to_string()),
                name: Some(shard_name(POOL, ShardKey::first(91))),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap()
        .status
        .is_some_and(|s| s.allowed)
}
