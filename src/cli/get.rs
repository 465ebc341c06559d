//! `kubectl portalloc get [NAME] [-A] [-l SELECTOR] [-w]`: PortAllocations as a table or as
//! objects, and with `-w` every change after.

use clap::Args;
use kube::ResourceExt;
use tabled::Tabled;

use futures::StreamExt;
use kube::api::Api;

use super::output::{
    OutputFormat, age, print_last_rows_without, print_names, print_objects, print_rows_without,
};
use super::{GlobalArgs, Session};
use crate::api::PortAllocation;
use crate::k8s::{self, ApiErrorKind, Seen, get_allocation, list_allocations_matching};

/// List PortAllocations with their pool, roles, ports and phase.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  kubectl portalloc get
  kubectl portalloc get -A -o wide
  kubectl portalloc get sglang-pd -n llm -o yaml

  # Only those with a label
  kubectl portalloc get -A -l team=a

  # The list, then a line for each PortAllocation that changes, until Ctrl-C
  kubectl portalloc get -w")]
pub struct GetArgs {
    pub name: Option<String>,
    /// List across all namespaces.
    #[arg(short = 'A', long, conflicts_with = "name")]
    pub all_namespaces: bool,
    /// Only those whose labels match this selector (e.g. team=a,tier!=dev), as kubectl's -l.
    #[arg(short = 'l', long, value_name = "SELECTOR", conflicts_with = "name")]
    pub selector: Option<String>,
    /// Print nothing, and succeed, when the named PortAllocation does not exist.
    #[arg(long)]
    pub ignore_not_found: bool,
    /// After the list, print a line for each PortAllocation that changes (deleted ones too),
    /// until stopped with Ctrl-C.
    #[arg(short = 'w', long)]
    pub watch: bool,
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output: OutputFormat,
}

#[derive(Tabled)]
struct Row {
    #[tabled(rename = "NAMESPACE")]
    namespace: String,
    #[tabled(rename = "NAME")]
    name: String,
    #[tabled(rename = "POOL")]
    pool: String,
    #[tabled(rename = "ROLES")]
    roles: String,
    #[tabled(rename = "PORTS")]
    ports: String,
    #[tabled(rename = "PHASE")]
    phase: String,
    #[tabled(rename = "AGE")]
    age: String,
    #[tabled(rename = "ASSIGNED")]
    assigned: String,
}

fn row(pa: &PortAllocation) -> Row {
    let status = pa.status.clone().unwrap_or_default();
    let desired = pa.spec.desired_port_count();
    Row {
        namespace: pa.namespace().unwrap_or_default(),
        name: pa.name_any(),
        pool: pa.spec.pool.clone(),
        roles: pa
            .spec
            .roles
            .iter()
            .map(|r| format!("{}:{}", r.name, r.replicas))
            .collect::<Vec<_>>()
            .join(","),
        ports: status.ports.unwrap_or_else(|| format!("0/{desired}")),
        phase: status
            .phase
            .map(|p| p.to_string())
            .unwrap_or_else(|| "Pending".into()),
        age: age(pa.metadata.creation_timestamp.as_ref()),
        assigned: status
            .assignments
            .iter()
            .map(|a| {
                let values: Vec<String> = a.values.iter().map(|v| v.to_string()).collect();
                format!("{}.{}={}", a.role, a.port, values.join(","))
            })
            .collect::<Vec<_>>()
            .join(" "),
    }
}

pub async fn run(global: &GlobalArgs, args: GetArgs) -> anyhow::Result<()> {
    let session = Session::connect(global).await?;
    let namespace = (!args.all_namespaces).then_some(session.namespace.as_str());
    let items = match &args.name {
        Some(name) => match get_allocation(&session.client, &session.namespace, name).await {
            Ok(pa) => vec![pa],
            Err(e) if args.ignore_not_found && e.kind() == ApiErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e.into()),
        },
        None => {
            list_allocations_matching(&session.client, namespace, args.selector.as_deref()).await?
        }
    };
    let table = Table {
        all_namespaces: args.all_namespaces,
        output: args.output,
    };
    let table_format = matches!(args.output, OutputFormat::Table | OutputFormat::Wide);
    let ignored = items.is_empty() && args.name.is_some();
    if items.is_empty() && table_format && !ignored {
        match args.all_namespaces {
            true => eprintln!("No PortAllocations found."),
            false => eprintln!(
                "No PortAllocations found in namespace {}.",
                session.namespace
            ),
        }
    }
    if !ignored {
        table.print(&items, &items, args.name.is_some() && !args.watch, true)?;
    }
    if !args.watch {
        return Ok(());
    }
    // The header goes with the first row, here or at the first change.
    let mut headed = !items.is_empty();
    let api: Api<PortAllocation> = match namespace {
        Some(ns) => Api::namespaced(session.client.clone(), ns),
        None => Api::all(session.client.clone()),
    };
    let mut shown = items.clone();
    let changes = k8s::changes(api, args.selector.as_deref(), &items);
    // One future for the whole watch: a Ctrl-C while a row is printed is not missed.
    let interrupted = tokio::signal::ctrl_c();
    futures::pin_mut!(changes, interrupted);
    loop {
        let seen = tokio::select! {
            seen = changes.next() => seen,
            _ = &mut interrupted => return Ok(()),
        };
        let pa = match seen {
            None => return Ok(()),
            Some(Seen::Interrupted(why)) => {
                eprintln!("warning: the watch broke ({why}); restarting it");
                continue;
            }
            Some(Seen::Changed(pa) | Seen::Deleted(pa)) => pa,
        };
        if args
            .name
            .as_ref()
            .is_some_and(|name| *name != pa.name_any())
        {
            continue;
        }
        shown.push(pa.clone());
        table.print(&shown, &[pa], true, !headed)?;
        headed = true;
        // Only the widths matter: the columns widen as longer rows come, never shrink.
        if shown.len() > 64 {
            shown.drain(..shown.len() - 64);
        }
    }
}

/// How `get` prints: the format, and whether the NAMESPACE column is shown.
struct Table {
    all_namespaces: bool,
    output: OutputFormat,
}

impl Table {
    /// Print `items`; a table's columns are as wide as `sized` needs (the rows shown so far),
    /// its header only when `header` (a watch prints one row per change after the first table).
    fn print(
        &self,
        sized: &[PortAllocation],
        items: &[PortAllocation],
        single: bool,
        header: bool,
    ) -> anyhow::Result<()> {
        match self.output {
            OutputFormat::Json | OutputFormat::Yaml => print_objects(items, self.output, single),
            OutputFormat::Name => print_names(
                "portallocation.portalloc.dev",
                items.iter().map(|pa| pa.name_any()),
            ),
            OutputFormat::Table | OutputFormat::Wide => {
                if items.is_empty() {
                    return Ok(());
                }
                let mut drop = Vec::new();
                if !self.all_namespaces {
                    drop.push(0);
                }
                if self.output != OutputFormat::Wide {
                    drop.push(7);
                }
                if header {
                    return print_rows_without(
                        &mut tabled::Table::new(items.iter().map(row)),
                        &drop,
                    );
                }
                let all: Vec<&PortAllocation> = sized.iter().chain(items).collect();
                let mut table = tabled::Table::new(all.iter().map(|pa| row(pa)));
                print_last_rows_without(&mut table, &drop, items.len())
            }
        }
    }
}
