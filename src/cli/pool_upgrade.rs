//! `kubectl portalloc pool upgrade NAME`: move a pool's record into PortPoolShards in place.

use clap::Args;
use kube::Client;

use super::output::{OutputFormat, print_names, print_objects};
use crate::k8s::{UpgradeReport, UpgradeStart, upgrade_pool};

/// Move a PortPool's holders into PortPoolShards (one per 256-port window), in place.
///
/// The pool's holder list is frozen (status.format Migrating), copied into one PortPoolShard per
/// 256-port window of the pool, then emptied (status.format Sharded). Allocations keep their
/// ports. While it runs (seconds), the API server refuses any change to the pool's holder
/// list; afterwards it refuses writes from clients older than this one on this pool (they
/// would write the old record). Interrupted, it leaves the pool Migrating: run it again, it
/// resumes. A pool already sharded is left unchanged.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  # Upgrade the pool \"default\"; running it again is safe
  kubectl portalloc pool upgrade default

  # The pool as written afterwards
  kubectl portalloc pool upgrade default -o yaml

  # Its shards
  kubectl get portpoolshards --field-selector spec.pool=default")]
pub struct UpgradeArgs {
    /// Pool name.
    pub name: String,
    /// Print the upgraded pool (json, yaml) or its name, instead of a summary.
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<OutputFormat>,
}

pub async fn upgrade(client: &Client, args: UpgradeArgs) -> anyhow::Result<()> {
    let report = upgrade_pool(client, &args.name).await?;
    match args.output {
        Some(format @ (OutputFormat::Json | OutputFormat::Yaml)) => {
            print_objects(&[report.pool], format, true)
        }
        Some(OutputFormat::Name) => print_names("portpool.portalloc.dev", [args.name]),
        _ => {
            println!("{}", summary(&args.name, &report));
            Ok(())
        }
    }
}

/// The one-line summary of an upgrade. Pure, so it is tested without a cluster.
pub fn summary(name: &str, report: &UpgradeReport) -> String {
    let copied = format!(
        "{} holders copied into {} PortPoolShards ({} written)",
        report.holders_copied, report.shards, report.shards_written
    );
    match report.start {
        UpgradeStart::AlreadySharded => {
            format!("portpool.portalloc.dev/{name} is already sharded (unchanged)")
        }
        // Another upgrader finished first while this one was retrying.
        _ if report.finished_elsewhere => {
            format!("portpool.portalloc.dev/{name} upgraded (by another client meanwhile)")
        }
        UpgradeStart::OneObject => format!("portpool.portalloc.dev/{name} upgraded: {copied}"),
        UpgradeStart::Resumed => format!(
            "portpool.portalloc.dev/{name} upgraded (resumed an interrupted upgrade): {copied}"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{PortPool, PortPoolSpec, StaticBandSetting};

    fn report(start: UpgradeStart, shards: usize, written: usize, holders: usize) -> UpgradeReport {
        let pool = PortPool::new(
            "p",
            PortPoolSpec {
                ranges: vec!["30000-32767".into()],
                exclude: vec![],
                protocol: Default::default(),
                static_band: StaticBandSetting::Auto,
            },
        );
        UpgradeReport {
            start,
            shards,
            shards_written: written,
            holders_copied: holders,
            finished_elsewhere: false,
            pool,
        }
    }

    #[test]
    fn the_summary_says_what_was_done() {
        assert_eq!(
            summary("p", &report(UpgradeStart::OneObject, 11, 11, 4)),
            "portpool.portalloc.dev/p upgraded: 4 holders copied into 11 PortPoolShards (11 written)"
        );
        assert_eq!(
            summary("p", &report(UpgradeStart::Resumed, 11, 3, 4)),
            "portpool.portalloc.dev/p upgraded (resumed an interrupted upgrade): 4 holders copied \
             into 11 PortPoolShards (3 written)"
        );
        assert_eq!(
            summary("p", &report(UpgradeStart::AlreadySharded, 0, 0, 0)),
            "portpool.portalloc.dev/p is already sharded (unchanged)"
        );
        let mut elsewhere = report(UpgradeStart::Resumed, 0, 0, 0);
        elsewhere.finished_elsewhere = true;
        assert_eq!(
            summary("p", &elsewhere),
            "portpool.portalloc.dev/p upgraded (by another client meanwhile)"
        );
    }
}
