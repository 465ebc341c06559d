//! `--dry-run=none|client|server`, as kubectl has it, on `create`, `sync`, `release` and
//! `delete`; and how a dry run's previews are printed (`diff` prints them its own way).

use std::fmt::Write as _;

use clap::{Args, ValueEnum};
use kube::ResourceExt;

use super::output::{OutputFormat, print_names, print_objects};
use super::{CliError, Session, exit_for};
use crate::api::{PortAllocation, PortPool};
use crate::core::{PortBlock, SlotKey};
use crate::k8s::{self, AllocateError, DryRun, Intent, Preview};

#[derive(ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DryRunMode {
    /// Do it.
    #[default]
    None,
    /// Decide against the pool as read now; send no write.
    Client,
    /// Also send every write with dryRun=All, so the API server checks it; it stores none.
    Server,
}

#[derive(Args, Debug, Clone, Default)]
pub struct DryRunArg {
    /// Preview the ports each PortAllocation would take and free; nothing is stored. `client`
    /// sends no write; `server` sends each write with dryRun=All for the API server to check
    /// (schema, admission policies, RBAC). A bare --dry-run means client.
    #[arg(
        long = "dry-run",
        value_enum,
        value_name = "MODE",
        num_args = 0..=1,
        require_equals = true,
        default_value = "none",
        default_missing_value = "client"
    )]
    pub dry_run: DryRunMode,
}

impl DryRunArg {
    pub fn mode(&self) -> Option<DryRun> {
        match self.dry_run {
            DryRunMode::None => None,
            DryRunMode::Client => Some(DryRun::Client),
            DryRunMode::Server => Some(DryRun::Server),
        }
    }
}

/// Preview `items`, print them as the command would have printed its results, and fail as it
/// would have on the first refusal (after printing every item).
pub async fn run(
    session: &Session,
    items: Vec<(PortAllocation, Intent)>,
    mode: DryRun,
    output: Option<OutputFormat>,
    new_pools: &[PortPool],
) -> anyhow::Result<()> {
    let single = items.len() == 1;
    let intents: Vec<Intent> = items.iter().map(|(_, intent)| intent.clone()).collect();
    let previews = k8s::preview(&session.client, items, mode, new_pools).await?;
    let suffix = match mode {
        DryRun::Client => "(dry run)",
        DryRun::Server => "(server dry run)",
    };
    let mut refusals = Vec::new();
    for (preview, intent) in previews.iter().zip(&intents) {
        if let Some(refusal) = &preview.refusal {
            if !single {
                eprintln!("error: {refusal} {suffix}");
            }
            refusals.push(refusal.clone());
        } else if output.is_none() {
            print!("{}", render(preview, intent, suffix));
        }
    }
    let done: Vec<&PortAllocation> = previews
        .iter()
        .filter(|p| p.refusal.is_none())
        .map(|p| &p.allocation)
        .collect();
    match output {
        Some(format @ (OutputFormat::Json | OutputFormat::Yaml)) => {
            print_objects(&done, format, single)?
        }
        Some(OutputFormat::Name) => print_names(
            "portallocation.portalloc.dev",
            done.iter().map(|pa| pa.name_any()),
        )?,
        _ => {}
    }
    let Some(first) = refusals.first() else {
        return Ok(());
    };
    let exit = exit_for(&anyhow::Error::from(AllocateError::Refused(first.clone())));
    let message = if single {
        format!("{first} {suffix}")
    } else {
        format!(
            "{} of {} PortAllocations would be refused (see above) {suffix}",
            refusals.len(),
            intents.len()
        )
    };
    Err(CliError::new(exit, message).into())
}

/// `portallocation.portalloc.dev/NAME VERB (dry run)`, then the ports it would take and free.
fn render(preview: &Preview, intent: &Intent, suffix: &str) -> String {
    let verb = match intent {
        Intent::Apply if !preview.exists => "created",
        Intent::Apply if preview.updated => "configured",
        Intent::Apply if preview.changes.is_change() => "synced",
        Intent::Apply => "unchanged",
        Intent::Sync => "synced",
        Intent::Release { .. } => "released",
        Intent::Delete => "deleted",
    };
    let (take, keep, free) = preview.changes.port_counts();
    let pa = &preview.allocation;
    let mut text = format!(
        "portallocation.portalloc.dev/{} {verb} {suffix}: would take {take} ports, keep {keep}, free {free} in pool {}\n",
        pa.name_any(),
        pa.spec.pool
    );
    for (mark, list) in [
        ("take", &preview.changes.take),
        ("free", &preview.changes.free),
    ] {
        for (slot, block) in list {
            let _ = writeln!(text, "  {mark}  {}", slot_line(slot, *block));
        }
    }
    text
}

/// `decode.rpc[2]  20117` (a block as `first-last`).
pub fn slot_line(slot: &SlotKey, block: PortBlock) -> String {
    format!("{:<28} {block}", slot.to_string())
}
