//! `kubectl portalloc version`.

use clap::Args;

/// Print the plugin's version.
#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  kubectl portalloc version\n  kubectl portalloc version -o json"
)]
pub struct VersionArgs {
    /// Output format: text or json.
    #[arg(short = 'o', long, value_enum, default_value_t = VersionFormat::Text)]
    pub output: VersionFormat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum VersionFormat {
    Text,
    Json,
}

pub fn run(args: VersionArgs) -> anyhow::Result<()> {
    let version = env!("CARGO_PKG_VERSION");
    let api = format!("{}/{}", crate::api::GROUP, crate::api::VERSION);
    if args.output == VersionFormat::Json {
        println!("{}", serde_json::json!({"version": version, "api": api}));
    } else {
        println!("kubectl-portalloc v{version} (API {api})");
    }
    Ok(())
}
