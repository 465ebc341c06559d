//! The local control plane of the end-to-end tests and the cluster benchmark, started in one way:
//! `scripts/local-cluster.sh up` (kube-apiserver and etcd built from their Go modules) with a
//! state directory of its own and this process's PID as the owner, so the servers stop by
//! themselves if the process dies. Dropping the handle runs `down`.

// Each crate that includes this file uses a different part of it.
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

/// The plugin binary cargo built for this test or benchmark target.
const BIN: &str = env!("CARGO_BIN_EXE_kubectl-portalloc");

/// How much of the script's stderr an error repeats (the rest went to our stderr as it came).
const STDERR_TAIL: usize = 40;

pub fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A running control plane, stopped with `down` when dropped.
pub struct ControlPlane {
    dir: PathBuf,
    pub kubeconfig: PathBuf,
    down: bool,
}

impl ControlPlane {
    /// `local-cluster.sh up` in `target/<name>-<pid>`, building kube-apiserver and etcd on first
    /// use (the script serialises concurrent builds). The kubeconfig is its last stdout line.
    pub fn up(name: &str) -> anyhow::Result<ControlPlane> {
        Self::up_with(name, &[])
    }

    /// As [`up`](Self::up), with extra kube-apiserver flags (kept for `start`).
    pub fn up_with(name: &str, apiserver_flags: &[&str]) -> anyhow::Result<ControlPlane> {
        let dir = repo_root()
            .join("target")
            .join(format!("{name}-{}", std::process::id()));
        let flags = apiserver_flags.join(" ");
        let stdout = script_with(&dir, &["up"], &[("PORTALLOC_APISERVER_FLAGS", &flags)])?;
        // Owned from here on: a bad last line still stops the servers on drop.
        let mut plane = ControlPlane {
            dir,
            kubeconfig: PathBuf::new(),
            down: false,
        };
        let Some(last) = stdout.lines().map(str::trim).rfind(|l| !l.is_empty()) else {
            bail!("`scripts/local-cluster.sh up` printed no kubeconfig path on stdout");
        };
        plane.kubeconfig = PathBuf::from(last);
        Ok(plane)
    }

    /// `local-cluster.sh stop [--kill]`: stop both servers (SIGKILL with `kill`, as a crash),
    /// keeping their data, certificates and ports for `start`.
    pub fn stop(&self, kill: bool) -> anyhow::Result<()> {
        let args: &[&str] = if kill { &["stop", "--kill"] } else { &["stop"] };
        script(&self.dir, args).map(drop)
    }

    /// `local-cluster.sh start`: start them again where `stop` left them, on the same ports.
    pub fn start(&self) -> anyhow::Result<()> {
        script(&self.dir, &["start"]).map(drop)
    }

    /// `local-cluster.sh down`: stop exactly what `up` started and delete its state. Once only;
    /// drop calls it too.
    pub fn down(&mut self) -> anyhow::Result<()> {
        if self.down {
            return Ok(());
        }
        self.down = true;
        script(&self.dir, &["down"]).map(drop)
    }

    /// A new admin client (the kubeconfig's current context) with its own connection pool.
    pub async fn client(&self) -> anyhow::Result<Client> {
        client_from(&self.kubeconfig, None).await
    }

    /// `count` admin clients, each with its own connection pool (one per simulated client).
    pub async fn clients(&self, count: usize) -> anyhow::Result<Vec<Client>> {
        let mut clients = Vec::with_capacity(count);
        for _ in 0..count {
            clients.push(self.client().await?);
        }
        Ok(clients)
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        // Never panic here: drop may run while a failed test unwinds.
        if let Err(e) = self.down() {
            eprintln!("warning: {e:#}");
        }
    }
}

/// A client for a kubeconfig file and one of its contexts (`None`: the current one).
pub async fn client_from(kubeconfig: &Path, context: Option<&str>) -> anyhow::Result<Client> {
    let file = Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("cannot read kubeconfig {}", kubeconfig.display()))?;
    let options = KubeConfigOptions {
        context: context.map(str::to_string),
        ..Default::default()
    };
    let config = Config::from_custom_kubeconfig(file, &options)
        .await
        .with_context(|| {
            format!(
                "kubeconfig {} (context {}) is not usable",
                kubeconfig.display(),
                context.unwrap_or("current")
            )
        })?;
    Client::try_from(config).context("cannot build a kube client")
}

/// `kubectl-portalloc install` on the cluster of `kubeconfig`: the CRDs, waited for, less the
/// binding of the pool overlap policy it also applies. The tests of one control plane share its
/// cluster-scoped pools and pick ranges on their own (`pool create --allow-overlap`, pools
/// applied as YAML), so the policy is bound only where a test checks it (tests/e2e/pool_overlap.rs,
/// with `install` run by the test itself).
pub fn install_crds(kubeconfig: &Path) -> anyhow::Result<()> {
    install(kubeconfig)?;
    let kubeconfig = kubeconfig.to_path_buf();
    // A runtime of its own: callers may be inside a test's runtime, which must not block.
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("a runtime to unbind the overlap policy")?
            .block_on(unbind_overlap_policy(&kubeconfig))
    })
    .join()
    .map_err(|_| anyhow::anyhow!("unbinding the overlap policy panicked"))?
}

async fn unbind_overlap_policy(kubeconfig: &Path) -> anyhow::Result<()> {
    use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding;
    let client = client_from(kubeconfig, None).await?;
    let bindings: kube::Api<ValidatingAdmissionPolicyBinding> = kube::Api::all(client);
    bindings
        .delete("portalloc-pool-overlap", &Default::default())
        .await
        .context("deleting ValidatingAdmissionPolicyBinding portalloc-pool-overlap")?;
    Ok(())
}

/// `kubectl-portalloc install` on the cluster of `kubeconfig`, as a user runs it.
pub fn install(kubeconfig: &Path) -> anyhow::Result<()> {
    let output = Command::new(BIN)
        .args(["install", "--timeout", "60s"])
        .env("KUBECONFIG", kubeconfig)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {BIN}"))?;
    if !output.status.success() {
        bail!(
            "installing the CRDs (`kubectl-portalloc install` on {}) failed ({})\n--- stdout\n{}--- stderr\n{}",
            kubeconfig.display(),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

/// Run `scripts/local-cluster.sh ARGS` on the state directory `dir` and return its stdout.
/// Its stderr (build and start-up progress) goes to ours as it comes, and its last lines are
/// repeated in the error if the script fails.
fn script(dir: &Path, args: &[&str]) -> anyhow::Result<String> {
    script_with(dir, args, &[])
}

/// [`script`] with more environment variables.
fn script_with(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<String> {
    let path = repo_root().join("scripts/local-cluster.sh");
    let command = format!(
        "PORTALLOC_CLUSTER_DIR={} scripts/local-cluster.sh {}",
        dir.display(),
        args.join(" ")
    );
    let mut child = Command::new(&path)
        .args(args)
        .env("PORTALLOC_CLUSTER_DIR", dir)
        .env(
            "PORTALLOC_CLUSTER_OWNER_PID",
            std::process::id().to_string(),
        )
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run `{command}`"))?;
    let stderr = child.stderr.take().expect("stderr is piped");
    // Read stderr on a thread so that neither pipe can fill up and block the script.
    let echo = std::thread::spawn(move || echo_and_keep_tail(stderr));
    let mut stdout = Vec::new();
    let read = child
        .stdout
        .take()
        .expect("stdout is piped")
        .read_to_end(&mut stdout);
    let status = child
        .wait()
        .with_context(|| format!("cannot wait for `{command}`"))?;
    let tail = echo.join().unwrap_or_default();
    read.with_context(|| format!("cannot read the output of `{command}`"))?;
    let stdout = String::from_utf8_lossy(&stdout).into_owned();
    if !status.success() {
        bail!("`{command}` failed ({status})\n--- stdout\n{stdout}--- stderr (last lines)\n{tail}");
    }
    Ok(stdout)
}

/// Copy `from` line by line to our stderr (unbuffered, so progress shows up while it runs, also
/// under the test harness, as when the script inherited it) and return its last lines.
fn echo_and_keep_tail(from: impl Read) -> String {
    let mut from = BufReader::new(from);
    let mut tail = std::collections::VecDeque::with_capacity(STDERR_TAIL);
    let mut line = Vec::new();
    // Bytes, not `lines()`: a line that is not UTF-8 must not stop the draining of the pipe.
    while matches!(from.read_until(b'\n', &mut line), Ok(n) if n > 0) {
        let _ = std::io::stderr().write_all(&line);
        if tail.len() == STDERR_TAIL {
            tail.pop_front();
        }
        tail.push_back(String::from_utf8_lossy(&line).into_owned());
        line.clear();
    }
    tail.into_iter().collect()
}

#[cfg(test)]
mod tests {
    // No `use` here: the bench crate (harness = false) sees cfg(test) but drops `#[test]` items,
    // which would leave an import unused there.
    #[test]
    fn a_failing_script_call_names_the_command_and_shows_its_output() {
        // `stop` on a directory without cluster state fails at once, with no server involved.
        let dir = tempfile::tempdir().unwrap();
        let plane = super::ControlPlane {
            dir: dir.path().to_path_buf(),
            kubeconfig: std::path::PathBuf::new(),
            down: true,
        };
        let error = format!("{:#}", plane.stop(true).unwrap_err());
        assert!(
            error.contains("scripts/local-cluster.sh stop --kill` failed"),
            "{error}"
        );
        assert!(error.contains(&dir.path().display().to_string()), "{error}");
        assert!(error.contains("no cluster state in"), "{error}");
    }
}
