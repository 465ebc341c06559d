//! Shell completion: `completion bash|zsh|fish` scripts for `kubectl-portalloc` itself, and the
//! protocol kubectl (1.26 and later) speaks with an executable named `kubectl_complete-portalloc`:
//! it passes the words typed after `kubectl portalloc` (the last one being completed) and reads
//! one candidate per line followed by `:<directive>`, as Cobra's `__complete` prints.

use clap::{Args, CommandFactory};
use clap_complete::Shell;

use super::Cli;
use crate::k8s::{self, ClientOptions};

/// Cobra's ShellCompDirectiveNoFileComp: do not fall back to file names.
const NO_FILE_COMPLETION: u8 = 4;
/// Cobra's ShellCompDirectiveDefault: the shell may complete file names.
const DEFAULT: u8 = 0;

/// The name kubectl looks for to complete `kubectl portalloc ...`.
pub const KUBECTL_COMPLETE_NAME: &str = "kubectl_complete-portalloc";

/// Print a shell completion script.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  # bash: completion for kubectl-portalloc (add to ~/.bashrc)
  source <(kubectl-portalloc completion bash)

  # zsh / fish
  kubectl-portalloc completion zsh > \"${fpath[1]}/_kubectl-portalloc\"
  kubectl-portalloc completion fish > ~/.config/fish/completions/kubectl-portalloc.fish

  # `kubectl portalloc <TAB>` (kubectl 1.26+): put this executable next to kubectl-portalloc
  kubectl-portalloc completion kubectl-plugin > ~/.local/bin/kubectl_complete-portalloc
  chmod +x ~/.local/bin/kubectl_complete-portalloc")]
pub struct CompletionArgs {
    /// bash, zsh, fish, or kubectl-plugin (the kubectl_complete-portalloc executable).
    #[arg(value_enum)]
    pub shell: CompletionShell,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CompletionShell {
    Bash,
    Zsh,
    Fish,
    /// The `kubectl_complete-portalloc` executable kubectl runs.
    KubectlPlugin,
}

pub fn run(args: CompletionArgs) -> anyhow::Result<()> {
    let shell = match args.shell {
        CompletionShell::Bash => Shell::Bash,
        CompletionShell::Zsh => Shell::Zsh,
        CompletionShell::Fish => Shell::Fish,
        CompletionShell::KubectlPlugin => {
            print!("{}", kubectl_plugin_script());
            return Ok(());
        }
    };
    let mut command = Cli::command();
    clap_complete::generate(
        shell,
        &mut command,
        "kubectl-portalloc",
        &mut std::io::stdout(),
    );
    Ok(())
}

/// The `kubectl_complete-portalloc` executable: a two-line shell script.
pub fn kubectl_plugin_script() -> &'static str {
    "#!/bin/sh\n# kubectl (1.26+) runs this to complete `kubectl portalloc ...`.\nexec kubectl-portalloc __complete \"$@\"\n"
}

/// What the cursor is on, worked out from the words before it.
#[derive(Debug, PartialEq, Eq)]
enum Slot {
    Subcommand(Vec<String>),
    Flag(Vec<String>),
    FlagValue(String),
    /// A positional argument of this subcommand path, e.g. `["pool", "describe"]`.
    Positional(Vec<String>),
}

/// `__complete WORDS... PARTIAL`: print candidates and a directive, Cobra style.
pub async fn complete(words: Vec<String>) {
    let (partial, before) = match words.split_last() {
        Some((last, rest)) => (last.clone(), rest.to_vec()),
        None => (String::new(), Vec::new()),
    };
    let (path, slot) = locate(&before, &partial);
    let (mut candidates, directive) = match slot {
        Slot::Subcommand(names) | Slot::Flag(names) => (names, NO_FILE_COMPLETION),
        Slot::FlagValue(flag) => match closed_set(&path, Some(&flag)) {
            Some(values) => (values, NO_FILE_COMPLETION),
            None => flag_values(&flag, &before).await,
        },
        Slot::Positional(path) => match closed_set(&path, None) {
            Some(values) => (values, NO_FILE_COMPLETION),
            None => (positionals(&path, &before).await, NO_FILE_COMPLETION),
        },
    };
    candidates.sort();
    candidates.dedup();
    for candidate in candidates.iter().filter(|c| c.starts_with(&partial)) {
        println!("{candidate}");
    }
    println!(":{directive}");
}

/// Walk the clap command tree along the typed words.
fn locate(before: &[String], partial: &str) -> (Vec<String>, Slot) {
    let root = Cli::command();
    let mut command = &root;
    let mut path = Vec::new();
    let mut positionals = 0;
    let mut expecting_value: Option<String> = None;
    for word in before {
        if expecting_value.take().is_some() {
            continue;
        }
        if let Some(flag) = word.strip_prefix('-') {
            let flag = flag.trim_start_matches('-');
            if !flag.contains('=') && takes_value(command, flag) {
                expecting_value = Some(word.clone());
            }
            continue;
        }
        if let Some(sub) = command.find_subcommand(word) {
            command = sub;
            path.push(word.clone());
        } else {
            positionals += 1;
        }
    }
    if let Some(flag) = expecting_value {
        return (path, Slot::FlagValue(flag));
    }
    if partial.starts_with('-') {
        let mut flags: Vec<String> = command
            .get_arguments()
            .chain(root.get_arguments().filter(|a| a.is_global_set()))
            .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
            .collect();
        flags.sort();
        flags.dedup();
        return (path, Slot::Flag(flags));
    }
    let subcommands: Vec<String> = command
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
        .map(|s| s.get_name().to_string())
        .collect();
    if !subcommands.is_empty() {
        return (path, Slot::Subcommand(subcommands));
    }
    if positionals == 0 {
        return (path.clone(), Slot::Positional(path));
    }
    (path, Slot::Subcommand(Vec::new()))
}

/// The values clap itself accepts for `flag` (the first positional argument when `None`) of the
/// subcommand at `path`, when they are a closed set: the same list a wrong value is answered with.
fn closed_set(path: &[String], flag: Option<&str>) -> Option<Vec<String>> {
    let root = Cli::command();
    let mut command = &root;
    for name in path {
        command = command.find_subcommand(name)?;
    }
    let arg = match flag {
        Some(flag) => {
            let flag = flag.trim_start_matches('-');
            command
                .get_arguments()
                .chain(root.get_arguments())
                .find(|a| {
                    a.get_long() == Some(flag)
                        || (flag.len() == 1 && a.get_short() == flag.chars().next())
                })?
        }
        None => command.get_positionals().next()?,
    };
    let values: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| v.get_name().to_string())
        .collect();
    (!values.is_empty()).then_some(values)
}

fn takes_value(command: &clap::Command, flag: &str) -> bool {
    let root = Cli::command();
    command
        .get_arguments()
        .chain(root.get_arguments())
        .find(|a| {
            a.get_long() == Some(flag) || (flag.len() == 1 && a.get_short() == flag.chars().next())
        })
        .is_some_and(|a| a.get_action().takes_values())
}

/// The value of `--flag` (or `-f`) among the typed words.
fn flag_value(words: &[String], long: &str, short: Option<char>) -> Option<String> {
    let mut iter = words.iter();
    while let Some(word) = iter.next() {
        let is_flag =
            word == &format!("--{long}") || short.is_some_and(|s| word == &format!("-{s}"));
        if is_flag {
            return iter.next().cloned();
        }
        if let Some(value) = word.strip_prefix(&format!("--{long}=")) {
            return Some(value.to_string());
        }
    }
    None
}

async fn flag_values(flag: &str, before: &[String]) -> (Vec<String>, u8) {
    let values = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
    // Closed sets (-o, --protocol) come from clap, in `closed_set`.
    match flag.trim_start_matches('-') {
        "static-band" => (values(&["Auto", "None"]), NO_FILE_COMPLETION),
        "f" | "filename" | "kubeconfig" => (Vec::new(), DEFAULT),
        "context" => (contexts(before), NO_FILE_COMPLETION),
        "n" | "namespace" => (namespaces(before).await, NO_FILE_COMPLETION),
        "role" => (roles(before).await, NO_FILE_COMPLETION),
        "pool" => (pools(before).await, NO_FILE_COMPLETION),
        _ => (Vec::new(), NO_FILE_COMPLETION),
    }
}

async fn positionals(path: &[String], before: &[String]) -> Vec<String> {
    match path
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["pool", "get" | "describe" | "delete" | "upgrade"] => pools(before).await,
        ["get" | "describe" | "sync" | "release" | "delete" | "resolve"] => {
            allocations(before).await
        }
        _ => Vec::new(),
    }
}

fn options(before: &[String]) -> ClientOptions {
    ClientOptions {
        kubeconfig: flag_value(before, "kubeconfig", None).map(Into::into),
        context: flag_value(before, "context", None),
        request_timeout: Some(std::time::Duration::from_secs(5)),
        // Completion reads, never allocates: no shard copies to keep.
        cache_dir: None,
    }
}

fn contexts(before: &[String]) -> Vec<String> {
    let kubeconfig = match flag_value(before, "kubeconfig", None) {
        Some(path) => kube::config::Kubeconfig::read_from(path).ok(),
        None => kube::config::Kubeconfig::read().ok(),
    };
    kubeconfig
        .map(|k| k.contexts.into_iter().map(|c| c.name).collect())
        .unwrap_or_default()
}

/// Completion must never fail loudly: no cluster simply means no names. Names come from
/// metadata-only lists: a pool's status or an allocation's spec would be read only to be dropped.
async fn namespace_and_client(before: &[String]) -> Option<(kube::Client, String)> {
    let connection = k8s::connect(&options(before)).await.ok()?;
    let (client, default_namespace) = (connection.client, connection.namespace);
    let namespace = flag_value(before, "namespace", Some('n')).unwrap_or(default_namespace);
    Some((client, namespace))
}

async fn namespaces(before: &[String]) -> Vec<String> {
    let Some((client, _)) = namespace_and_client(before).await else {
        return Vec::new();
    };
    k8s::names::namespace_names(client)
        .await
        .unwrap_or_default()
}

async fn pools(before: &[String]) -> Vec<String> {
    let Some((client, _)) = namespace_and_client(before).await else {
        return Vec::new();
    };
    k8s::names::pool_names(client).await.unwrap_or_default()
}

async fn allocations(before: &[String]) -> Vec<String> {
    let Some((client, namespace)) = namespace_and_client(before).await else {
        return Vec::new();
    };
    k8s::names::allocation_names(client, &namespace)
        .await
        .unwrap_or_default()
}

/// Roles of the PortAllocation named on the line (`resolve NAME --role <TAB>`).
async fn roles(before: &[String]) -> Vec<String> {
    let Some(name) = before
        .iter()
        .skip_while(|w| w.as_str() != "resolve" && w.as_str() != "release")
        .nth(1)
    else {
        return Vec::new();
    };
    let Some((client, namespace)) = namespace_and_client(before).await else {
        return Vec::new();
    };
    k8s::names::role_names(client, &namespace, name)
        .await
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn locates_subcommands_flags_and_positionals() {
        let (_, slot) = locate(&[], "");
        let Slot::Subcommand(names) = slot else {
            panic!("{slot:?}")
        };
        assert!(names.contains(&"resolve".to_string()) && names.contains(&"pool".to_string()));
        assert!(
            !names.contains(&"__complete".to_string()),
            "hidden commands stay hidden"
        );

        let (_, slot) = locate(&words("pool"), "");
        let Slot::Subcommand(names) = slot else {
            panic!("{slot:?}")
        };
        assert_eq!(names, vec!["create", "get", "describe", "delete"]);

        assert_eq!(
            locate(&words("pool describe"), "").1,
            Slot::Positional(words("pool describe"))
        );
        assert_eq!(
            locate(&words("resolve -n llm"), "").1,
            Slot::Positional(words("resolve"))
        );
        assert_eq!(
            locate(&words("resolve x --role"), "").1,
            Slot::FlagValue("--role".into())
        );
        assert_eq!(locate(&words("get -o"), "").1, Slot::FlagValue("-o".into()));

        let (_, slot) = locate(&words("resolve"), "--r");
        let Slot::Flag(flags) = slot else {
            panic!("{slot:?}")
        };
        assert!(flags.contains(&"--role".to_string()) && flags.contains(&"--context".to_string()));
    }

    #[test]
    fn flag_values_are_found_in_both_spellings() {
        assert_eq!(
            flag_value(&words("get -n llm"), "namespace", Some('n')).as_deref(),
            Some("llm")
        );
        assert_eq!(
            flag_value(&words("get --namespace=llm"), "namespace", Some('n')).as_deref(),
            Some("llm")
        );
        assert_eq!(flag_value(&words("get"), "namespace", Some('n')), None);
    }
}
