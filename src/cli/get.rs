//! `kubectl portalloc get [NAME] [-A]`: PortAllocations as a table or as objects.

use clap::Args;
use kube::ResourceExt;
use tabled::Tabled;

use super::output::{OutputFormat, age, print_names, print_objects, print_rows_without};
use super::{GlobalArgs, Session};
use crate::api::PortAllocation;
use crate::k8s::{get_allocation, list_allocations};

/// List PortAllocations with their pool, roles, ports and phase.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  kubectl portalloc get
  kubectl portalloc get -A -o wide
  kubectl portalloc get sglang-pd -n llm -o yaml")]
pub struct GetArgs {
    pub name: Option<String>,
    /// List across all namespaces.
    #[arg(short = 'A', long, conflicts_with = "name")]
    pub all_namespaces: bool,
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
    let items = match &args.name {
        Some(name) => vec![get_allocation(&session.client, &session.namespace, name).await?],
        None => {
            let namespace = (!args.all_namespaces).then_some(session.namespace.as_str());
            list_allocations(&session.client, namespace).await?
        }
    };
    match args.output {
        OutputFormat::Json | OutputFormat::Yaml => {
            print_objects(&items, args.output, args.name.is_some())
        }
        OutputFormat::Name => print_names(
            "portallocation.portalloc.dev",
            items.iter().map(|pa| pa.name_any()),
        ),
        OutputFormat::Table | OutputFormat::Wide => {
            if items.is_empty() {
                match args.all_namespaces {
                    true => eprintln!("No PortAllocations found."),
                    false => eprintln!(
                        "No PortAllocations found in namespace {}.",
                        session.namespace
                    ),
                }
                return Ok(());
            }
            let mut table = tabled::Table::new(items.iter().map(row));
            let mut drop = Vec::new();
            if !args.all_namespaces {
                drop.push(0);
            }
            if args.output != OutputFormat::Wide {
                drop.push(7);
            }
            print_rows_without(&mut table, &drop)
        }
    }
}
