//! 2n: pools that fill, at cluster level, through the CLI as users fill them (one `create -f`
//! process per PortAllocation, `delete` to free), with the binary under test
//! (`PORTALLOC_BENCH_BIN` for an older build: the before/after of packed placement).
//!
//! - The vLLM-Ray example's own pool and PortAllocation (428 ports, blocks of 64): copies are
//!   created until the first refusal; then 3 are deleted and 3 new copies created. The same
//!   pool again with `nodeReuse` 2, 4 and 8: how many copies it holds (issue 28's capacity).
//! - A random mix (1-12 single ports and 0-3 blocks of 8, 16, 32 or 64 per object) into an empty
//!   4,096-port pool until the first refusal; a random half deleted; refilled until the next.
//!   Occupancy at each refusal, min and median over the seeds.

use std::path::Path;

use kube::Client;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_yaml::Value;

use crate::controlplane::ControlPlane;
use crate::scale::binary;
use crate::{Row, dash, workload};

const NS: &str = "filling";

/// `create -f` of one document: whether it was created (exit 4 = refused; anything else fails).
fn create(kubeconfig: &Path, yaml: &str) -> anyhow::Result<bool> {
    let file = tempfile::NamedTempFile::new()?;
    std::fs::write(file.path(), yaml)?;
    let output = std::process::Command::new(binary())
        .args(["create", "-f", file.path().to_str().unwrap(), "-n", NS])
        .env("KUBECONFIG", kubeconfig)
        .output()?;
    match output.status.code() {
        Some(0) => Ok(true),
        Some(4) => Ok(false),
        _ => anyhow::bail!("create failed: {}", String::from_utf8_lossy(&output.stderr)),
    }
}

fn delete(kubeconfig: &Path, name: &str) -> anyhow::Result<()> {
    let output = std::process::Command::new(binary())
        .args(["delete", name, "-n", NS])
        .env("KUBECONFIG", kubeconfig)
        .output()?;
    anyhow::ensure!(
        output.status.success(),
        "delete {name}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

pub async fn measure(
    plane: &ControlPlane,
    admin: &Client,
    quick: bool,
) -> anyhow::Result<Vec<Row>> {
    workload::create_namespace(admin, NS).await?;
    let kubeconfig = plane.kubeconfig.as_path();
    let mut rows = Vec::new();
    for reuse in [1, 2, 4, 8] {
        rows.push(vllm_ray(kubeconfig, quick, reuse)?);
    }
    rows.extend(random_mix(kubeconfig, quick)?);
    Ok(rows)
}

/// Copies of the vLLM-Ray example's PortAllocation in the example's pool, with `nodeReuse`.
fn vllm_ray(kubeconfig: &Path, quick: bool, reuse: usize) -> anyhow::Result<Row> {
    let example = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/vllm-ray-lws.yaml"),
    )?;
    let docs: Vec<Value> = serde_yaml::Deserializer::from_str(&example)
        .map(|d| serde::Deserialize::deserialize(d).map_err(anyhow::Error::from))
        .collect::<anyhow::Result<_>>()?;
    let mut pool = docs
        .iter()
        .find(|d| d["kind"] == "PortPool")
        .unwrap()
        .clone();
    let pool_name = format!("llm-filling-r{reuse}");
    pool["metadata"]["name"] = pool_name.clone().into();
    if reuse > 1 {
        pool["spec"]["nodeReuse"] = (reuse as i64).into();
    }
    anyhow::ensure!(
        create(kubeconfig, &serde_yaml::to_string(&pool)?)?,
        "the example's pool"
    );
    let mut pa = docs
        .iter()
        .find(|d| d["kind"] == "PortAllocation")
        .unwrap()
        .clone();
    pa["spec"]["pool"] = pool_name.clone().into();
    // Each copy its own: no ConfigMap shared between them.
    pa["spec"].as_mapping_mut().unwrap().remove("configMap");
    let copy = |i: usize| -> anyhow::Result<String> {
        let mut pa = pa.clone();
        pa["metadata"]["name"] = format!("vllm-ray-r{reuse}-{i}").into();
        Ok(serde_yaml::to_string(&pa)?)
    };
    let expected = 9 * reuse;
    let limit = if quick { 2 } else { expected + 5 };
    let mut held = 0;
    while held < limit && create(kubeconfig, &copy(held)?)? {
        held += 1;
    }
    let mut refit = 0;
    if held >= 3 && !quick {
        for i in 0..3 {
            delete(kubeconfig, &format!("vllm-ray-r{reuse}-{i}"))?;
        }
        for i in 0..3 {
            refit += usize::from(create(kubeconfig, &copy(100 + i)?)?);
        }
    }
    let what = match reuse {
        1 => "vLLM-Ray example's pool (3,998 ports): copies of its PortAllocation (428 ports, blocks of 64) held at the first refusal; then 3 deleted, 3 new ones created".to_string(),
        n => format!("the same pool with nodeReuse: {n}: copies held at the first refusal; then 3 deleted, 3 new ones created"),
    };
    Ok(Row {
        id: "2n",
        what,
        ours: format!("{held} held; {refit} of 3 fit again"),
        anchor: format!("{expected} by arithmetic ({reuse} x 9)"),
        ratio: dash(),
        target: format!("{expected}; 3 of 3"),
        met: crate::yes_no(held >= expected && refit == 3),
    })
}

/// One random object: 1-12 single ports and 0-3 blocks of 8, 16, 32 or 64.
fn mixed(rng: &mut StdRng, name: &str, pool: &str) -> (String, u32) {
    let singles = rng.random_range(1..=12);
    let blocks: Vec<u32> = (0..rng.random_range(0..=3))
        .map(|_| [8, 16, 32, 64][rng.random_range(0..4)])
        .collect();
    let mut ports: Vec<String> = (0..singles)
        .map(|p| format!("    - {{name: s{p}, scope: RoleScoped, env: S{p}}}\n"))
        .collect();
    ports.extend(blocks.iter().enumerate().map(|(b, count)| {
        format!("    - {{name: b{b}, scope: RoleScoped, env: B{b}, count: {count}}}\n")
    }));
    let yaml = format!(
        "apiVersion: portalloc.dev/v1alpha1\nkind: PortAllocation\nmetadata: {{name: {name}}}\n\
         spec:\n  pool: {pool}\n  roles:\n  - name: app\n    replicas: 1\n    ports:\n{}",
        ports.concat()
    );
    (yaml, singles + blocks.iter().sum::<u32>())
}

fn random_mix(kubeconfig: &Path, quick: bool) -> anyhow::Result<Vec<Row>> {
    const SIZE: u32 = 4096;
    // Pools side by side from port 30000: at most 8 fit below 65536.
    let seeds: u64 = match std::env::var("PORTALLOC_BENCH_SEEDS") {
        Ok(n) => n.parse::<u64>()?.clamp(1, 8),
        Err(_) if quick => 1,
        Err(_) => 3,
    };
    let (mut first, mut refill) = (Vec::new(), Vec::new());
    for seed in 0..seeds {
        let pool = format!("mix-{seed}");
        let start = 30000 + seed as u32 * SIZE;
        let yaml = format!(
            "apiVersion: portalloc.dev/v1alpha1\nkind: PortPool\nmetadata: {{name: {pool}}}\n\
             spec: {{ranges: [\"{start}-{}\"], staticBand: None}}\n",
            start + SIZE - 1
        );
        anyhow::ensure!(create(kubeconfig, &yaml)?, "pool {pool}");
        let mut rng = StdRng::seed_from_u64(seed);
        let mut live: Vec<(String, u32)> = Vec::new();
        let mut next = 0;
        let mut fill = |rng: &mut StdRng, live: &mut Vec<(String, u32)>| -> anyhow::Result<f64> {
            loop {
                let name = format!("mix-{seed}-{next}");
                next += 1;
                let (yaml, ports) = mixed(rng, &name, &pool);
                if !create(kubeconfig, &yaml)? || (quick && live.len() >= 2) {
                    let held: u32 = live.iter().map(|(_, p)| p).sum();
                    return Ok(f64::from(held) / f64::from(SIZE) * 100.0);
                }
                live.push((name, ports));
            }
        };
        first.push(fill(&mut rng, &mut live)?);
        // Delete a random half, then refill.
        let mut kept = Vec::new();
        for (name, ports) in std::mem::take(&mut live) {
            if rng.random_bool(0.5) {
                delete(kubeconfig, &name)?;
            } else {
                kept.push((name, ports));
            }
        }
        live = kept;
        refill.push(fill(&mut rng, &mut live)?);
    }
    let summary = |mut values: Vec<f64>| {
        values.sort_by(f64::total_cmp);
        (values[0], values[values.len() / 2])
    };
    let (a, b) = (summary(first), summary(refill));
    let row = |what: &str, (min, median): (f64, f64)| Row {
        id: "2n",
        what: format!(
            "random mix into a 4,096-port pool, {what}, {seeds} seeds: occupancy at the refusal, min / median"
        ),
        ours: format!("{min:.1} % / {median:.1} %"),
        anchor: dash(),
        ratio: dash(),
        target: "≥ 90 %".into(),
        met: crate::yes_no(min >= 90.0),
    };
    Ok(vec![
        row("first refusal", a),
        row("after deleting half and refilling", b),
    ])
}
