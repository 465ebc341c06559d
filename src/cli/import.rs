//! `kubectl portalloc import -f FILE`: RoleBasedGroup port-allocator annotations to
//! PortAllocations.

use std::io::Read;

use clap::Args;
use serde::Deserialize;

use super::{CliError, Exit};
use crate::api::{RBG_ANNOTATION, import_rbg};

/// Print the PortAllocation equivalent of RoleBasedGroup manifests' port annotations
///
/// Reads RoleBasedGroup manifests (workloads.x-k8s.io v1alpha1 or v1alpha2: standalone roles,
/// leaderWorkerPattern, customComponentsPattern components) that use the
/// `rolebasedgroup.workloads.x-k8s.io/port-allocator` and `component-discovery` annotations.
/// What has no equivalent yet (address references, per-instance groups, other RBG annotations)
/// is listed as `# note:` lines, never dropped silently. Changes nothing in the cluster.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  # Convert, review, then allocate
  kubectl portalloc import -f rbg.yaml --pool default > ports.yaml
  kubectl portalloc create -f ports.yaml")]
pub struct ImportArgs {
    /// RoleBasedGroup manifests (YAML, several documents allowed), or - for standard input.
    #[arg(short = 'f', long = "filename", value_name = "FILE")]
    pub file: String,
    /// The PortPool the PortAllocations draw from.
    #[arg(long, default_value = "default")]
    pub pool: String,
}

pub fn run(args: ImportArgs) -> anyhow::Result<()> {
    let text = if args.file == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text)?;
        text
    } else {
        std::fs::read_to_string(&args.file)
            .map_err(|e| CliError::new(Exit::Invalid, format!("cannot read {}: {e}", args.file)))?
    };
    let mut out = Vec::new();
    for (index, document) in serde_yaml::Deserializer::from_str(&text).enumerate() {
        let value = serde_json::Value::deserialize(document).map_err(|e| {
            CliError::new(
                Exit::Invalid,
                format!("{}: document {}: not valid YAML: {e}", args.file, index + 1),
            )
        })?;
        // Any RBG port directive (port-allocator or component-discovery) makes a document
        // worth importing; the import names what it cannot translate.
        if value.is_null()
            || !value
                .to_string()
                .contains("rolebasedgroup.workloads.x-k8s.io/")
        {
            continue;
        }
        let imported = import_rbg(&value, &args.pool)
            .map_err(|e| CliError::new(Exit::Invalid, e.to_string()))?;
        let mut yaml = String::new();
        for note in &imported.notes {
            yaml.push_str(&format!("# note: {note}\n"));
        }
        let mut object = serde_json::to_value(&imported.allocation)?;
        if let Some(map) = object.as_object_mut() {
            map.remove("status");
        }
        yaml.push_str(&serde_yaml::to_string(&object)?);
        out.push(yaml);
    }
    if out.is_empty() {
        return Err(CliError::new(
            Exit::Invalid,
            format!(
                "{}: no manifest with the {RBG_ANNOTATION} annotation found",
                args.file
            ),
        )
        .into());
    }
    print!("{}", out.join("---\n"));
    Ok(())
}
