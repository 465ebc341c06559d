//! Cell 2d: duplicate ports handed out by a RoleBasedGroup-style random allocator (simulated)
//! and by us (measured) on the same workload.

use anyhow::{bail, ensure};
use kube::api::Api;
use kube::{Client, ResourceExt};
use rand::SeedableRng;
use rand::rngs::StdRng;

use portalloc::api::{PortAllocation, PortPool};
use portalloc::ledger::recorded_holdings;

use crate::controlplane::ControlPlane;
use crate::report::{dash, yes_no};
use crate::{Row, Scale, baseline, workload};

pub(crate) async fn duplicates(
    plane: &ControlPlane,
    admin: &Client,
    scale: &Scale,
) -> anyhow::Result<Vec<Row>> {
    let ns = "duplicates";
    workload::create_namespace(admin, ns).await?;
    let clients = plane.clients(16).await?;
    let (first, last) = (45000u16, 49999u16);
    let mut rng = StdRng::seed_from_u64(6);
    let mut rows = Vec::new();
    for ports in [1u32, 4] {
        let pool = format!("duplicates-{ports}");
        workload::create_pool(admin, &pool, &format!("{first}-{last}")).await?;
        let cell = workload::run_ours(
            &clients,
            ns,
            &pool,
            &pool,
            scale.duplicate_pods as usize,
            ports,
        )
        .await;
        ensure!(
            cell.failures.is_empty(),
            "duplicates workload: {:?}",
            cell.failures
        );
        let (handed_out, distinct) = handed_out_ports(admin, &pool).await?;
        let ours_duplicates = handed_out - distinct;
        let random = baseline::simulate(
            scale.duplicate_pods,
            ports,
            first,
            last,
            scale.random_trials,
            &mut rng,
        );
        rows.push(Row {
            id: "2d",
            what: format!(
                "ports handed out twice: {} pods × {ports} port{} in a 5,000-port range, one call per pod",
                scale.duplicate_pods,
                if ports == 1 { "" } else { "s" }
            ),
            ours: format!(
                "{ours_duplicates} of {handed_out} ports (measured: 16 concurrent clients, {} conflicts retried)",
                cell.conflicts
            ),
            anchor: format!(
                "RoleBasedGroup random (simulated): {:.2} per workload; ≥ 1 in {:.0}% of {} workloads",
                random.mean_duplicates,
                random.share_with_duplicate * 100.0,
                random.trials
            ),
            ratio: dash(),
            target: "ours 0".into(),
            met: yes_no(ours_duplicates == 0),
        });
    }
    Ok(rows)
}

/// Every port the pool's PortAllocations record in their status and the pool records for its
/// holders, counted with repeats and without: the difference is the number of duplicates.
async fn handed_out_ports(admin: &Client, pool: &str) -> anyhow::Result<(usize, usize)> {
    let pools: Api<PortPool> = Api::all(admin.clone());
    let record = workload::window_record(admin, &pools.get(pool).await?).await?;
    ensure!(
        record.anomalies.is_empty(),
        "pool {pool}: {:?}",
        record.anomalies
    );
    let api: Api<PortAllocation> = Api::all(admin.clone());
    let mut ports = Vec::new();
    for pa in api.list(&Default::default()).await?.items {
        if pa.spec.pool != pool {
            continue;
        }
        let recorded = pa
            .status
            .as_ref()
            .map(recorded_holdings)
            .unwrap_or_default();
        let uid = pa.uid().unwrap_or_default();
        if recorded != record.holdings_of(&uid) {
            bail!("{}: status and pool entry differ", pa.name_any());
        }
        ports.extend(recorded.ports());
    }
    let handed_out = ports.len();
    ports.sort_unstable();
    ports.dedup();
    Ok((handed_out, ports.len()))
}
