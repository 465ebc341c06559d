//! `kubectl portalloc create -f FILE|-`: create or update, then allocate.

use clap::Args;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::{Client, ResourceExt};

use super::allocations::op;
use super::manifest::{Manifest, read_manifests};
use super::output::{OutputFormat, print_names, print_objects};
use super::pool::get_pool;
use super::report::print_report;
use super::{CliError, Exit, GlobalArgs, Session};
use crate::api::{PortAllocation, PortPool};
use crate::k8s::{
    AllocateError, KubeError, Op, PoolRecord, SyncReport, explain, owner_of, precheck,
};

/// Create or update PortAllocations (and PortPools) from YAML, then allocate their ports.
///
/// Every document is checked before anything is written. A new PortAllocation whose ports
/// cannot be allocated is not created at all; an existing one keeps its ports when re-applied.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  # Allocate the ports a file describes
  kubectl portalloc create -f sglang-pd.yaml

  # From standard input
  cat sglang-pd.yaml | kubectl portalloc create -f -

  # Re-running is idempotent: every pod keeps its port
  kubectl portalloc create -f sglang-pd.yaml -o yaml")]
pub struct CreateArgs {
    /// A YAML file of PortAllocations and PortPools, or - for standard input.
    #[arg(short = 'f', long = "filename", value_name = "FILE")]
    pub file: String,
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<OutputFormat>,
}

pub async fn run(global: &GlobalArgs, args: CreateArgs) -> anyhow::Result<()> {
    let manifests = read_manifests(&args.file)?;
    let session = Session::connect(global).await?;
    let mut pools = Vec::new();
    let mut allocations = Vec::new();
    for manifest in manifests {
        match manifest {
            Manifest::Pool(pool) => {
                pool.spec.port_set().map_err(|e| {
                    CliError::new(
                        Exit::Invalid,
                        format!("PortPool {:?}: {e}", pool.name_any()),
                    )
                })?;
                pools.push(pool);
            }
            Manifest::Allocation(mut pa) => {
                let namespace = resolve_namespace(&pa, global, &session)?;
                pa.metadata.namespace = Some(namespace);
                pa.spec.validate().map_err(|e| {
                    CliError::new(
                        Exit::Invalid,
                        format!("PortAllocation {}: {e}", owner_of(&pa)),
                    )
                })?;
                allocations.push(pa);
            }
        }
    }
    for pool in pools {
        apply_pool(&session.client, pool).await?;
    }
    let mut results = Vec::new();
    for pa in allocations {
        let report = apply_allocation(&session, pa).await?;
        if args.output.is_none() {
            print_report(&report, session.verbosity);
        }
        results.push(report.allocation);
    }
    match args.output {
        Some(format @ (OutputFormat::Json | OutputFormat::Yaml)) => {
            print_objects(&results, format, results.len() == 1)
        }
        Some(OutputFormat::Name) => print_names(
            "portallocation.portalloc.dev",
            results.iter().map(|pa| pa.name_any()),
        ),
        _ => Ok(()),
    }
}

/// The document's namespace, else `-n`, else the context's; a document that names another
/// namespace than an explicit `-n` is refused, as kubectl does.
fn resolve_namespace(
    pa: &PortAllocation,
    global: &GlobalArgs,
    session: &Session,
) -> Result<String, CliError> {
    match (
        pa.metadata.namespace.as_deref(),
        global.namespace.as_deref(),
    ) {
        (Some(doc), Some(flag)) if doc != flag => Err(CliError::new(
            Exit::Invalid,
            format!(
                "PortAllocation {:?} is in namespace {doc:?} but -n says {flag:?}: drop -n or make them agree",
                pa.name_any()
            ),
        )),
        (Some(doc), _) => Ok(doc.to_string()),
        (None, _) => Ok(session.namespace.clone()),
    }
}

async fn apply_pool(client: &Client, pool: PortPool) -> anyhow::Result<()> {
    let api: Api<PortPool> = Api::all(client.clone());
    let name = pool.name_any();
    let pool_op = |verb| Op {
        verb,
        resource: "portpools.portalloc.dev",
        kind: "PortPool",
        name: Some(&name),
        namespace: None,
    };
    match api.create(&PostParams::default(), &pool).await {
        Ok(created) => {
            let record = PoolRecord::load(created.clone())?;
            let mut initialized = created;
            initialized.status = Some(record.current_status());
            api.replace_status(&name, &PostParams::default(), &initialized)
                .await
                .map_err(|e| explain(e, &pool_op("update")))?;
            println!("portpool.portalloc.dev/{name} created");
        }
        Err(kube::Error::Api(s)) if s.is_already_exists() => {
            let mut existing = api
                .get(&name)
                .await
                .map_err(|e| explain(e, &pool_op("get")))?;
            if existing.spec == pool.spec {
                println!("portpool.portalloc.dev/{name} unchanged");
            } else {
                existing.spec = pool.spec;
                api.replace(&name, &PostParams::default(), &existing)
                    .await
                    .map_err(|e| explain(e, &pool_op("update")))?;
                println!("portpool.portalloc.dev/{name} configured");
            }
        }
        Err(e) => return Err(explain(e, &pool_op("create")).into()),
    }
    Ok(())
}

/// Four requests when nothing contends: read the pool, create the PortAllocation, write the
/// pool, write the PortAllocation's status.
async fn apply_allocation(session: &Session, pa: PortAllocation) -> anyhow::Result<SyncReport> {
    let namespace = pa.namespace().unwrap_or_default();
    let name = pa.name_any();
    let api: Api<PortAllocation> = Api::namespaced(session.client.clone(), &namespace);
    let pool = match get_pool(&session.client, &pa.spec.pool).await {
        Ok(pool) => pool,
        Err(KubeError::NotFound { .. }) => {
            return Err(AllocateError::PoolNotFound {
                pool: pa.spec.pool.clone(),
                owner: owner_of(&pa),
            }
            .into());
        }
        Err(e) => return Err(e.into()),
    };
    let record = PoolRecord::load(pool.clone())
        .map_err(|e| CliError::new(Exit::Invalid, format!("PortPool {:?}: {e}", pa.spec.pool)))?;
    if let Err(refused) = precheck(&record, &pa) {
        // Refused as a new object: only an existing one (whose own ports count as free for it)
        // can still go ahead. Either way nothing has been written yet.
        let existing = api
            .get_opt(&name)
            .await
            .map_err(|e| explain(e, &op("get", Some(&name), Some(&namespace))))?;
        return match existing {
            Some(existing) => update_existing(session, &api, existing, pa, &record, pool).await,
            None => Err(refused.into()),
        };
    }
    let mut to_create = pa.clone();
    to_create.status = None;
    match api.create(&PostParams::default(), &to_create).await {
        Ok(created) => match session.allocator.sync(created.clone(), Some(pool)).await {
            Ok(report) => Ok(report),
            Err(e) => {
                // The pool changed under us and no longer fits: undo, so a refused create
                // leaves nothing behind.
                remove_created(&api, &created).await;
                Err(e.into())
            }
        },
        Err(kube::Error::Api(s)) if s.is_already_exists() => {
            let existing = api
                .get(&name)
                .await
                .map_err(|e| explain(e, &op("get", Some(&name), Some(&namespace))))?;
            update_existing(session, &api, existing, pa, &record, pool).await
        }
        Err(e) => Err(explain(e, &op("create", Some(&name), Some(&namespace))).into()),
    }
}

/// Re-applying: check the new spec against what the object already holds, update the spec if it
/// changed, and sync. Unchanged specs keep every port.
async fn update_existing(
    session: &Session,
    api: &Api<PortAllocation>,
    mut existing: PortAllocation,
    pa: PortAllocation,
    record: &PoolRecord,
    pool: PortPool,
) -> anyhow::Result<SyncReport> {
    let name = existing.name_any();
    let namespace = existing.namespace().unwrap_or_default();
    if existing.spec.pool != pa.spec.pool {
        return Err(CliError::new(
            Exit::Invalid,
            format!(
                "PortAllocation {}: spec.pool is immutable ({:?} -> {:?}): delete it with `kubectl portalloc delete {name} -n {namespace}` and create it again",
                owner_of(&existing),
                existing.spec.pool,
                pa.spec.pool
            ),
        )
        .into());
    }
    let mut desired = existing.clone();
    desired.spec = pa.spec.clone();
    precheck(record, &desired)?;
    if existing.spec != pa.spec {
        existing = replace_spec(api, existing, &pa).await?;
    }
    match session.allocator.sync(existing.clone(), Some(pool)).await {
        Ok(report) => Ok(report),
        Err(e) => {
            session.allocator.record_failure(&existing, &e).await;
            Err(e.into())
        }
    }
}

/// Write the new spec. A 409 means another client wrote the object since it was read (often
/// only its status, by a concurrent `sync`): read it again and retry a few times rather than
/// fail a re-apply that nobody contradicted.
async fn replace_spec(
    api: &Api<PortAllocation>,
    mut existing: PortAllocation,
    desired: &PortAllocation,
) -> anyhow::Result<PortAllocation> {
    let name = existing.name_any();
    let namespace = existing.namespace().unwrap_or_default();
    let mut tries = 0;
    loop {
        existing.spec = desired.spec.clone();
        match api.replace(&name, &PostParams::default(), &existing).await {
            Ok(updated) => return Ok(updated),
            Err(kube::Error::Api(s)) if s.is_conflict() && tries < 5 => {
                tries += 1;
                existing = api
                    .get(&name)
                    .await
                    .map_err(|e| explain(e, &op("get", Some(&name), Some(&namespace))))?;
                if existing.spec == desired.spec {
                    return Ok(existing);
                }
            }
            Err(e) => return Err(explain(e, &op("update", Some(&name), Some(&namespace))).into()),
        }
    }
}

/// Delete an object this command created, only if it is still that object.
async fn remove_created(api: &Api<PortAllocation>, created: &PortAllocation) {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: created.uid(),
            resource_version: None,
        }),
        ..Default::default()
    };
    if let Err(e) = api.delete(&created.name_any(), &params).await {
        eprintln!(
            "warning: could not remove PortAllocation {} after the failed allocation ({e}); delete it with \
             `kubectl portalloc delete {} -n {}`",
            owner_of(created),
            created.name_any(),
            created.namespace().unwrap_or_default()
        );
    }
}
