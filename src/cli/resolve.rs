//! `kubectl portalloc resolve`: the environment a pod should get.

use std::collections::BTreeMap;
use std::io::Write;

use clap::Args;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;

use super::{CliError, Exit, GlobalArgs, Session};
use crate::api::{EnvVar, env_configmap, env_lines};
use crate::k8s;
use crate::k8s::get_allocation;

const EXAMPLES: &str = "Examples:
  # What pod 1 of the decode role gets, as KEY=VALUE lines (with groups, index g*replicas+i)
  kubectl portalloc resolve sglang-pd --role decode --index 1

  # The same, from the pod's name (a StatefulSet pod, an LWS leader sglang-1 or worker
  # sglang-1-2, or a Deployment role's name), for a shell
  eval \"$(kubectl portalloc resolve sglang-pd --pod decode-1 -o export)\"

  # Every env file, keyed by pod name, as JSON
  kubectl portalloc resolve sglang-pd --all -o json

  # One ConfigMap with every pod's env file (<pod-name>.env; <role>.env for a Deployment's
  # pods), written to the cluster
  kubectl portalloc resolve sglang-pd --all -o configmap --apply";

/// Print the environment one pod should get: its ports and its role's references.
#[derive(Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct ResolveArgs {
    /// The PortAllocation.
    pub name: String,
    /// The pod's role (needed with --index; with --pod only when the name fits two roles).
    #[arg(long, required_unless_present_any = ["all", "pod"])]
    pub role: Option<String>,
    /// The pod's index in its role: g*replicas+i for pod i of group g.
    #[arg(long, conflicts_with_all = ["pod", "all"])]
    pub index: Option<u32>,
    /// The pod's name as its workload names it (with --role naming a role without workload:
    /// any name ending in -<index>); a Deployment role's pods go by the role's name.
    #[arg(long, conflicts_with = "all")]
    pub pod: Option<String>,
    /// Every pod of every role (with -o configmap, json or yaml).
    #[arg(long, conflicts_with = "role")]
    pub all: bool,
    /// env (KEY=VALUE), export (shell), json, yaml, or configmap (with --all).
    #[arg(short = 'o', long, value_enum, default_value_t = EnvFormat::Env)]
    pub output: EnvFormat,
    /// With -o configmap: write the ConfigMap to the cluster (server-side apply).
    #[arg(long)]
    pub apply: bool,
    /// With -o configmap: its name (default: <name>-ports).
    #[arg(long)]
    pub configmap_name: Option<String>,
}

/// What `resolve -o` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EnvFormat {
    /// `KEY=VALUE` lines.
    Env,
    /// `export KEY=VALUE` lines, for a shell.
    Export,
    Json,
    Yaml,
    /// A ConfigMap with one env file per pod (with --all).
    Configmap,
}

pub async fn run(global: &GlobalArgs, args: ResolveArgs) -> anyhow::Result<()> {
    if args.output == EnvFormat::Configmap && !args.all {
        return Err(CliError::new(
            Exit::Usage,
            "-o configmap needs --all: it holds every pod's env file",
        )
        .into());
    }
    if args.apply && args.output != EnvFormat::Configmap {
        return Err(CliError::new(Exit::Usage, "--apply goes with --all -o configmap").into());
    }
    let session = Session::connect(global).await?;
    let pa = get_allocation(&session.client, &session.namespace, &args.name).await?;
    if let Some(warning) = pa.reused_ports_warning() {
        eprintln!("warning: {warning}");
    }
    let invalid = |e: crate::api::ResolveError| {
        let exit = match e {
            crate::api::ResolveError::NotAllocated { .. } => Exit::Refused,
            _ => Exit::Invalid,
        };
        CliError::new(exit, e.to_string())
    };
    if args.all {
        let all = pa.resolve_all().map_err(invalid)?;
        return match args.output {
            EnvFormat::Configmap => {
                let configmap =
                    env_configmap(&pa, args.configmap_name.as_deref()).map_err(invalid)?;
                if args.apply {
                    apply_configmap(&session, &configmap).await
                } else {
                    print!("{}", serde_yaml::to_string(&configmap)?);
                    Ok(())
                }
            }
            EnvFormat::Json | EnvFormat::Yaml => {
                let flat: BTreeMap<String, BTreeMap<String, String>> = all
                    .iter()
                    .map(|(pod, env)| (pod.clone(), flat(env)))
                    .collect();
                print_structured(args.output, &flat)
            }
            EnvFormat::Env | EnvFormat::Export => {
                let mut out = std::io::stdout().lock();
                for (pod, env) in &all {
                    writeln!(out, "# {pod}")?;
                    write!(out, "{}", env_file(env, args.output))?;
                }
                Ok(())
            }
        };
    }
    let (role, index) = match (args.index, &args.pod) {
        (Some(index), _) => (args.role.clone().unwrap_or_default(), index),
        (None, Some(pod)) => pa.locate_pod(args.role.as_deref(), pod).map_err(invalid)?,
        (None, None) => {
            return Err(CliError::new(
                Exit::Usage,
                "say which pod: --index I or --pod NAME (or --all for every pod)",
            )
            .into());
        }
    };
    let env = pa.resolve_env(&role, index).map_err(invalid)?;
    match args.output {
        EnvFormat::Json | EnvFormat::Yaml => print_structured(args.output, &flat(&env)),
        // Without --all there is no ConfigMap: refused above.
        format => {
            print!("{}", env_file(&env, format));
            Ok(())
        }
    }
}

fn flat(env: &[EnvVar]) -> BTreeMap<String, String> {
    env.iter()
        .map(|e| (e.name.clone(), e.value.clone()))
        .collect()
}

fn print_structured<T: serde::Serialize>(format: EnvFormat, value: &T) -> anyhow::Result<()> {
    if format == EnvFormat::Json {
        println!("{}", serde_json::to_string_pretty(value)?);
    } else {
        print!("{}", serde_yaml::to_string(value)?);
    }
    Ok(())
}

/// `KEY=VALUE` lines, or `export KEY=VALUE` for a shell.
fn env_file(env: &[EnvVar], format: EnvFormat) -> String {
    env_lines(
        env,
        if format == EnvFormat::Export {
            "export "
        } else {
            ""
        },
    )
}

async fn apply_configmap(session: &Session, configmap: &ConfigMap) -> anyhow::Result<()> {
    k8s::apply_configmap(&session.client, configmap).await?;
    let (name, namespace) = (
        configmap.name_any(),
        configmap.namespace().unwrap_or_default(),
    );
    println!("configmap/{name} applied in {namespace}");
    Ok(())
}
