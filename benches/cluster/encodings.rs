//! 2i: what a pool record of 65,535 one-port holders weighs in today's encoding and in compact
//! ones, against etcd's request limit. Pure arithmetic on real encodings (no server): it decides
//! whether one object can hold every port of 1-65535 at all, and into how many objects (shards)
//! a record must be split.

use portalloc::api::{PoolHolder, PortPoolShardStatus};

use crate::{Row, dash};

/// etcd's default `--max-request-bytes` (1.5 MiB): the largest value one write may carry.
const ETCD_LIMIT: usize = 1_572_864;
/// Objects of this size were allocated into in ~40-60 ms in the 2f cell (1,000 holders).
const FAST_OBJECT: usize = 100_000;
const HOLDERS: u32 = 65_535;

fn uid(i: u32) -> String {
    format!("{i:08x}-7c1e-4f2a-9b3d-{:012x}", u64::from(i) * 7919)
}

/// Namespace and name as GitOps tools name things (not the shortest possible).
fn owner(i: u32) -> (String, String) {
    (
        format!("team-{:02}", i % 50),
        format!("inference-job-{i:05}"),
    )
}

pub fn record_sizes() -> anyhow::Result<Vec<Row>> {
    let n = HOLDERS;
    // Today: the status as the allocator writes it.
    let today = serde_json::to_vec(&PortPoolShardStatus {
        holders: (0..n)
            .map(|i| {
                let (ns, name) = owner(i);
                PoolHolder {
                    uid: uid(i),
                    owner: format!("{ns}/{name}"),
                    ports: format!("worker.p0={}", 1 + i),
                }
            })
            .collect(),
        ..Default::default()
    })?
    .len();
    // What repair and the tenancy policy need, and no more: uid and namespace per holder; the
    // port and slot as short text; no human-readable name.
    let uid_and_namespace: usize = (0..n)
        .map(|i| {
            format!(
                "{{\"u\":\"{}\",\"n\":\"{}\",\"p\":\"w.p0={}\"}},",
                uid(i),
                owner(i).0,
                1 + i
            )
            .len()
        })
        .sum();
    // Packed text, one holder per line: the uid as 16 bytes in base64 (22 characters), the
    // namespace as an index into a table, the port: the least a holder identity can take.
    let namespaces: usize = (0..50).map(|k| format!("\"team-{k:02}\",").len()).sum();
    let packed: usize = namespaces
        + (0..n)
            .map(|i| format!("{} {} {}\n", "A".repeat(22), i % 50, 1 + i).len())
            .sum::<usize>();
    // A bitmap of the 65,536 ports alone (base64), the NodePort allocator's record: no owners.
    let bitmap = 65_536usize.div_ceil(8).div_ceil(3) * 4;

    let row = |name: &str, bytes: usize, note: &str| {
        let per = bytes as f64 / f64::from(n);
        let fits = bytes <= ETCD_LIMIT;
        Row {
            id: "2i",
            what: format!("pool record of {n} one-port holders: {name}"),
            ours: format!(
                "{:.2} MB, {per:.1} bytes per held port; {}; {} objects of ≤ 1.5 MiB, {} of ≤ 100 kB{note}",
                bytes as f64 / 1e6,
                if fits {
                    "fits one object"
                } else {
                    "**over** etcd's 1.5 MiB"
                },
                bytes.div_ceil(ETCD_LIMIT),
                bytes.div_ceil(FAST_OBJECT),
            ),
            anchor: dash(),
            ratio: dash(),
            target: dash(),
            met: dash(),
        }
    };
    Ok(vec![
        row(
            "today's status (uid, namespace/name, slot=port per holder)",
            today,
            "",
        ),
        row(
            "uid + namespace + short slot, no name",
            uid_and_namespace,
            "",
        ),
        row(
            "packed: 16-byte uid in base64, namespace index, port",
            packed,
            "; the tenancy policy could no longer read namespaces in CEL",
        ),
        row(
            "bitmap only (NodePort's record)",
            bitmap,
            "; no owner: repair could not tell whose port, the tenancy policy nothing",
        ),
    ])
}
