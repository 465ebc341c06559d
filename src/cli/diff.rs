//! `kubectl portalloc diff -f FILE|-`: what applying a manifest would do to each
//! PortAllocation's ports, decided against the pools as they are now, with nothing written.
//! Exits 1 when something would change, as `kubectl diff` does.

use clap::Args;
use kube::ResourceExt;

use super::dry_run::slot_line;
use super::manifest::{Manifest, read_manifests};
use super::{CliError, Exit, GlobalArgs, Session, exit_for};
use crate::k8s::{self, Applied, DryRun, Intent, Preview};
use crate::ledger::owner_of;

/// Show the ports a manifest's PortAllocations would take, keep and free.
///
/// Lines start with `+` (a port it would take), a space (one it keeps) or `-` (one it would
/// free). Exit status: 0 when nothing would change, 1 when something would (as `kubectl
/// diff`), another code when an object would be refused (its reason is printed).
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  # Review a scale-up before merging it
  kubectl portalloc diff -f sglang-pd.yaml

  # In CI: fail the check when the manifest would move ports
  kubectl portalloc diff -f - < rendered.yaml || echo \"ports would change\"")]
pub struct DiffArgs {
    /// A YAML file of PortAllocations and PortPools, or - for standard input.
    #[arg(short = 'f', long = "filename", value_name = "FILE")]
    pub file: String,
}

pub async fn run(global: &GlobalArgs, args: DiffArgs) -> anyhow::Result<()> {
    let manifests = read_manifests(&args.file)?;
    let session = Session::connect(global).await?;
    let mut pools = Vec::new();
    let mut items = Vec::new();
    for manifest in manifests {
        match manifest {
            Manifest::Pool(pool) => pools.push(pool),
            Manifest::Allocation(mut pa) => {
                if pa.metadata.namespace.is_none() {
                    pa.metadata.namespace = Some(session.namespace.clone());
                }
                pa.spec.validate().map_err(|e| {
                    CliError::new(
                        Exit::Invalid,
                        format!("PortAllocation {}: {e}", owner_of(&pa)),
                    )
                })?;
                items.push((pa, Intent::Apply));
            }
        }
    }
    let mut changed = false;
    for pool in &pools {
        let applied = k8s::preview_pool(&session.client, pool, DryRun::Client).await?;
        let what = match applied {
            Applied::Unchanged => continue,
            Applied::Created => "would be created",
            Applied::Configured => "spec would change",
        };
        changed = true;
        println!("portpool.portalloc.dev/{}: {what}", pool.name_any());
    }
    let previews = k8s::preview(&session.client, items, DryRun::Client, &pools).await?;
    let mut refusals = Vec::new();
    for preview in &previews {
        print!("{}", render(preview));
        changed |= !preview.exists || preview.updated || preview.changes.is_change();
        if let Some(refusal) = &preview.refusal {
            refusals.push(refusal.clone());
        }
    }
    if let Some(refusal) = refusals.into_iter().next() {
        let error = anyhow::Error::from(k8s::AllocateError::Refused(refusal));
        return Err(CliError::new(
            exit_for(&error),
            "a PortAllocation would be refused (see above); nothing was written",
        )
        .into());
    }
    if changed {
        // As `kubectl diff`: 1 means differences, and the output already said which.
        return Err(CliError::new(Exit::Failure, "").into());
    }
    Ok(())
}

/// One PortAllocation: a header with the counts, then its ports.
fn render(preview: &Preview) -> String {
    let pa = &preview.allocation;
    let mut notes = Vec::new();
    if !preview.exists {
        notes.push("new object");
    } else if preview.updated {
        notes.push("spec changes");
    }
    let (take, keep, free) = preview.changes.port_counts();
    let mut text = format!(
        "portallocation.portalloc.dev/{} in {} (pool {}): take {take}, keep {keep}, free {free}{}\n",
        pa.name_any(),
        pa.namespace().unwrap_or_default(),
        pa.spec.pool,
        if notes.is_empty() {
            String::new()
        } else {
            format!(" ({})", notes.join(", "))
        }
    );
    if let Some(refusal) = &preview.refusal {
        text.push_str(&format!("! refused: {refusal}\n"));
        return text;
    }
    let changes = &preview.changes;
    let mut lines: Vec<(String, char)> = Vec::new();
    for (mark, list) in [
        ('+', &changes.take),
        (' ', &changes.keep),
        ('-', &changes.free),
    ] {
        for (slot, block) in list {
            lines.push((slot_line(slot, *block), mark));
        }
    }
    // In slot order, so a role's ports stay together whatever happens to them.
    lines.sort();
    for (line, mark) in lines {
        text.push_str(&format!("{mark} {line}\n"));
    }
    text
}
