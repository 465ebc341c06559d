//! End-to-end tests against a real kube-apiserver and etcd (see `support`). One binary, so one
//! control plane serves the whole run; each test works in its own namespace.

mod support;

mod allocation;
mod bad_input;
mod batch;
mod blocks;
mod concurrency;
mod configmap;
mod crash;
mod crd_validation;
mod dry_run;
mod events;
mod examples;
mod faults;
mod follow_nodes;
mod health;
mod helm;
mod import;
mod leader_election;
mod metrics;
mod node_agent;
mod pods;
mod pool_cache;
mod rbac;
mod reference_validation;
mod repair;
mod restart;
mod reuse;
mod reuse_race;
mod scheduling;
mod shard_rbac;
mod shard_repair;
mod sharded;
mod simulation;
mod spread;
mod verbs;
mod watch;
mod watch_batch;
mod webhook;
mod webhook_cache;
mod webhook_cleanup;
mod webhook_ha;
mod webhook_record;
