//! `kubectl portalloc pool get [NAME] [-l SELECTOR] [-w]`: pools and their usage, as a table
//! (its FREE the word `kubectl get ppool` uses) or as objects, and with `-w` every change after.

use clap::Args;
use kube::{Client, ResourceExt};
use tabled::Tabled;

use crate::api::PortPool;
use crate::cli::output::{
    OutputFormat, age, print_last_rows_without, print_names, print_objects, print_rows_without,
};
use crate::k8s::{self, PoolView, get_pool};

/// List PortPools with their usage.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  kubectl portalloc pool get
  kubectl portalloc pool get default -o yaml

  # Then a line for each pool that changes, until Ctrl-C
  kubectl portalloc pool get -w")]
pub struct GetArgs {
    pub name: Option<String>,
    /// Only pools whose labels match this selector (e.g. tier=gpu), as kubectl's -l.
    #[arg(short = 'l', long, value_name = "SELECTOR", conflicts_with = "name")]
    pub selector: Option<String>,
    /// Print nothing, and succeed, when the named pool does not exist.
    #[arg(long)]
    pub ignore_not_found: bool,
    /// After the list, print a line for each pool that changes (its usage as counted by the
    /// watcher too), until stopped with Ctrl-C.
    #[arg(short = 'w', long)]
    pub watch: bool,
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output: OutputFormat,
}

#[derive(Tabled)]
struct PoolRow {
    #[tabled(rename = "NAME")]
    name: String,
    #[tabled(rename = "PROTOCOL")]
    protocol: String,
    #[tabled(rename = "RANGES")]
    ranges: String,
    #[tabled(rename = "SIZE")]
    size: u32,
    #[tabled(rename = "ALLOCATED")]
    allocated: u32,
    #[tabled(rename = "FREE")]
    available: u32,
    #[tabled(rename = "HOLDERS")]
    holders: usize,
    #[tabled(rename = "AGE")]
    age: String,
    /// `-o wide` only: its `nodeReuse` (ALLOCATED and FREE count every copy).
    #[tabled(rename = "REUSE")]
    reuse: u16,
}

/// The REUSE column, which only `-o wide` shows.
const REUSE_COLUMN: usize = 8;

/// One table row; `view` is the pool's record as readers see it (its shards' union), `None`
/// when the spec is unusable.
fn row(pool: &PortPool, view: Option<&PoolView>) -> PoolRow {
    let ranges = pool
        .spec
        .ranges
        .iter()
        .map(|r| r.0.as_str())
        .collect::<Vec<_>>()
        .join(",");
    let base = PoolRow {
        name: pool.name_any(),
        protocol: pool.spec.protocol.to_string(),
        ranges,
        size: 0,
        reuse: pool.spec.reuse(),
        allocated: 0,
        available: 0,
        holders: 0,
        age: age(pool.metadata.creation_timestamp.as_ref()),
    };
    // With reuse, FREE counts every copy: how many more pods' ports fit.
    match view {
        Some(view) => PoolRow {
            size: view.record.state.size(),
            allocated: view.held(),
            available: view.capacity().saturating_sub(view.held()),
            holders: view.holders(),
            ..base
        },
        None => base,
    }
}

pub async fn get(client: &Client, args: GetArgs) -> anyhow::Result<()> {
    let items = match &args.name {
        Some(name) => match get_pool(client, name).await {
            Ok(pool) => vec![pool],
            Err(e) if args.ignore_not_found && e.kind() == k8s::ApiErrorKind::NotFound => {
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        },
        None => k8s::list_pools_matching(client, args.selector.as_deref()).await?,
    };
    let table = matches!(args.output, OutputFormat::Table | OutputFormat::Wide);
    if items.is_empty() && table {
        eprintln!(
            "No PortPools found. Create one with `kubectl portalloc pool create NAME --range A-B`."
        );
    }
    print_pools(
        client,
        &items,
        &items,
        args.output,
        args.name.is_some() && !args.watch,
        true,
    )
    .await?;
    if !args.watch {
        return Ok(());
    }
    let mut headed = !items.is_empty();
    let mut shown = items.clone();
    let api: kube::Api<PortPool> = kube::Api::all(client.clone());
    let changes = k8s::changes(api, args.selector.as_deref(), &items);
    // One future for the whole watch: a Ctrl-C while a row is printed is not missed.
    let interrupted = tokio::signal::ctrl_c();
    futures::pin_mut!(changes, interrupted);
    loop {
        let seen = tokio::select! {
            seen = futures::StreamExt::next(&mut changes) => seen,
            _ = &mut interrupted => return Ok(()),
        };
        let pool = match seen {
            None => return Ok(()),
            Some(k8s::Seen::Interrupted(why)) => {
                eprintln!("warning: the watch broke ({why}); restarting it");
                continue;
            }
            Some(k8s::Seen::Changed(pool) | k8s::Seen::Deleted(pool)) => pool,
        };
        if args
            .name
            .as_ref()
            .is_some_and(|name| *name != pool.name_any())
        {
            continue;
        }
        shown.push(pool.clone());
        print_pools(client, &shown, &[pool], args.output, true, !headed).await?;
        headed = true;
        // Only the widths matter: the columns widen as longer rows come.
        if shown.len() > 64 {
            shown.drain(..shown.len() - 64);
        }
    }
}

/// Print `items` in `output`; a table's columns as wide as `sized` needs, its header only
/// when `header` (a watch prints one row per change after the first table).
async fn print_pools(
    client: &Client,
    sized: &[PortPool],
    items: &[PortPool],
    output: OutputFormat,
    single: bool,
    header: bool,
) -> anyhow::Result<()> {
    match output {
        OutputFormat::Json | OutputFormat::Yaml => print_objects(items, output, single),
        OutputFormat::Name => {
            print_names("portpool.portalloc.dev", items.iter().map(|p| p.name_any()))
        }
        OutputFormat::Table | OutputFormat::Wide => {
            if items.is_empty() {
                return Ok(());
            }
            let drop: &[usize] = match output {
                OutputFormat::Wide => &[],
                _ => &[REUSE_COLUMN],
            };
            if header {
                let rows = rows_of(client, items).await?;
                return print_rows_without(&mut tabled::Table::new(rows), drop);
            }
            // The rows before only size the columns: their usage as first read is enough.
            let mut rows: Vec<PoolRow> = sized.iter().map(|p| row(p, None)).collect();
            rows.extend(rows_of(client, items).await?);
            print_last_rows_without(&mut tabled::Table::new(rows), drop, items.len())
        }
    }
}

/// A row for each pool, with its usage as its shards record it.
async fn rows_of(client: &Client, pools: &[PortPool]) -> anyhow::Result<Vec<PoolRow>> {
    let mut rows = Vec::new();
    for pool in pools {
        let view = k8s::pool_view(client, pool.clone()).await?.ok();
        rows.push(row(pool, view.as_ref()));
    }
    Ok(rows)
}
