//! Group commit for callers that come one at a time: the watcher's reconciles. Each caller
//! queues its PortAllocation under its pool; the first caller of a pool with no batch running
//! leads: it syncs everything queued for that pool with [`Allocator::sync_many`] (one write per
//! changed shard) and goes round again while more has queued meanwhile. The others wait for
//! their own result. Nobody waits for a batch to fill: a lone caller is a batch of one, so a
//! quiet watcher syncs with no added latency (a round only lets a queue that is still growing
//! settle, for a few turns of the runtime). At most `concurrency` pools run a batch at once;
//! a leader waiting its turn keeps gathering its pool's callers.
//!
//! Up to 4,096 callers wait at once (the watcher's reconciles in flight), so what each
//! waiting one holds counts: its object is shared with the watcher's cache (an `Arc`, cloned
//! only into the batch that syncs it), and the batch it may lead, or the sync it may run alone,
//! is boxed, so a waiting caller's future stays small rather than sized for a whole batch.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use super::allocator::{AllocateError, Allocator};
use super::sync::SyncReport;
use crate::api::PortAllocation;

type Reply = oneshot::Sender<Result<SyncReport, AllocateError>>;

#[derive(Default)]
struct Queue {
    waiting: Vec<(Arc<PortAllocation>, Reply)>,
    leader: bool,
}

/// Shared by every reconcile of one watcher.
#[derive(Clone)]
pub struct GroupCommit {
    allocator: Allocator,
    queues: Arc<Mutex<HashMap<String, Queue>>>,
    /// How many pools run a batch at once.
    rounds: Arc<tokio::sync::Semaphore>,
}

impl GroupCommit {
    pub fn new(allocator: Allocator, concurrency: usize) -> GroupCommit {
        GroupCommit {
            allocator,
            queues: Arc::default(),
            rounds: Arc::new(tokio::sync::Semaphore::new(concurrency.max(1))),
        }
    }

    /// [`Allocator::sync_or_record`], committed together with whatever else is queued for the
    /// same pool.
    pub async fn sync_or_record(
        &self,
        pa: Arc<PortAllocation>,
    ) -> Result<SyncReport, AllocateError> {
        let pool = pa.spec.pool.clone();
        let (reply, answer) = oneshot::channel();
        let lead = {
            let mut queues = self.lock();
            let queue = queues.entry(pool.clone()).or_default();
            queue.waiting.push((pa.clone(), reply));
            !std::mem::replace(&mut queue.leader, true)
        };
        if lead {
            let guard = Leader {
                group_commit: self,
                pool: &pool,
                handed_back: AtomicBool::new(false),
            };
            Box::pin(guard.drain()).await;
        }
        match answer.await {
            Ok(result) => result,
            // The leader was cancelled (shutdown) before it answered: go alone.
            Err(_) => {
                let pa = Arc::unwrap_or_clone(pa);
                Box::pin(self.allocator.sync_or_record(pa)).await
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Queue>> {
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The caller running a pool's batches. Dropped (done or cancelled), it hands the pool back:
/// callers still queued get no answer and go alone.
struct Leader<'a> {
    group_commit: &'a GroupCommit,
    pool: &'a str,
    /// The queue was removed with nothing in it: a later caller may lead a new one.
    handed_back: AtomicBool,
}

impl Leader<'_> {
    async fn drain(&self) {
        loop {
            // Never closed, so the permit always comes.
            let _turn = self.group_commit.rounds.acquire().await;
            self.settle().await;
            let batch = {
                let mut queues = self.group_commit.lock();
                match queues.get_mut(self.pool) {
                    Some(queue) if !queue.waiting.is_empty() => std::mem::take(&mut queue.waiting),
                    _ => {
                        // Under the same lock as the check: nobody queued in between.
                        queues.remove(self.pool);
                        self.handed_back.store(true, Ordering::Relaxed);
                        return;
                    }
                }
            };
            let (pas, replies): (Vec<_>, Vec<_>) = batch
                .into_iter()
                .map(|(pa, reply)| (Arc::unwrap_or_clone(pa), reply))
                .unzip();
            let results = self.group_commit.allocator.sync_many(pas).await;
            for (reply, result) in replies.into_iter().zip(results) {
                let _ = reply.send(result);
            }
        }
    }
}

impl Leader<'_> {
    /// Let the queue stop growing before a round takes it. The callers a round answered are
    /// followed by the next ones at once (a watcher starts a reconcile as each ends), but they
    /// arrive over the next few turns of the runtime: a round taken at once got one of them
    /// and the next round the rest, a whole round of writes for one object. A queue that does
    /// not grow over a turn (a lone caller) is taken then; a growing one within
    /// [`SETTLE_TURNS`] turns.
    async fn settle(&self) {
        let queued = || {
            let queues = self.group_commit.lock();
            queues.get(self.pool).map_or(0, |queue| queue.waiting.len())
        };
        let mut seen = queued();
        for _ in 0..SETTLE_TURNS {
            tokio::task::yield_now().await;
            let now = queued();
            if now == seen {
                return;
            }
            seen = now;
        }
    }
}

/// How many turns of the runtime a round waits at most for its queue to stop growing.
const SETTLE_TURNS: usize = 64;

impl Drop for Leader<'_> {
    fn drop(&mut self) {
        // Cancelled mid-batch: removing the queue drops the replies not sent, and those callers
        // go alone. (After a clean hand-back the queue may be a new leader's: leave it.)
        if !self.handed_back.load(Ordering::Relaxed) {
            self.group_commit.lock().remove(self.pool);
        }
    }
}
