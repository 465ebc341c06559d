//! Group commit for callers that come one at a time: the watcher's reconciles. Each caller
//! queues its PortAllocation under its pool; the first caller of a pool with no batch running
//! leads: it syncs everything queued for that pool with [`Allocator::sync_many`] (one write per
//! changed shard) and goes round again while more has queued meanwhile. The others wait for
//! their own result. Nobody waits for a batch to fill: a lone caller is a batch of one, so a
//! quiet watcher syncs with no added latency (a round only lets a queue that is still growing
//! settle: a few turns of the runtime, or until the callers the last round answered are
//! back). At most `concurrency` pools run a batch at once; a leader waiting its turn keeps
//! gathering its pool's callers.
//!
//! Up to 4,096 callers wait at once (the watcher's reconciles in flight), so what each
//! waiting one holds counts: its object is shared with the watcher's cache (an `Arc`, cloned
//! only into the batch that syncs it), and the batch it may lead, or the sync it may run alone,
//! is boxed, so a waiting caller's future stays small rather than sized for a whole batch.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
        // Callers the last round answered plus those queued behind it: how many may come.
        let mut expected = 0;
        loop {
            // Never closed, so the permit always comes.
            let _turn = self.group_commit.rounds.acquire().await;
            self.settle(expected).await;
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
            expected = replies.len() + self.queued();
            for (reply, result) in replies.into_iter().zip(results) {
                let _ = reply.send(result);
            }
        }
    }
}

impl Leader<'_> {
    /// Let the queue stop growing before a round takes it. The callers a round answered are
    /// followed by the next ones at once (a watcher starts a reconcile as each ends), but they
    /// arrive a few at each turn of the runtime: a round taken at once got one of them and the
    /// next round the rest, a whole round of writes for one object; and once split, rounds
    /// stay split (each comes back while the other is written). So a growing queue is taken
    /// when it holds the `expected` callers (the last round's and those queued behind it), or
    /// stops growing, or after [`SETTLE_MAX`]. A queue that does not grow over a turn and
    /// expects no more (a lone caller) is taken then.
    async fn settle(&self, expected: usize) {
        let started = Instant::now();
        let mut settling = Settling::new(expected, self.queued());
        let mut step = Step::Turn;
        loop {
            match step {
                Step::Take => return,
                Step::Turn => tokio::task::yield_now().await,
                Step::Sleep => tokio::time::sleep(SETTLE_QUIET).await,
            }
            step = settling.look(self.queued(), started.elapsed());
        }
    }

    fn queued(&self) -> usize {
        let queues = self.group_commit.lock();
        queues.get(self.pool).map_or(0, |queue| queue.waiting.len())
    }
}

/// How many turns of the runtime a round with nobody expected waits at most for its queue
/// to stop growing.
const SETTLE_TURNS: usize = 64;
/// How long a round waits at most for the callers it expects. A round of thousands takes
/// seconds to write, so a quarter of a second is little beside it; a lone caller never waits
/// it (its queue does not grow).
const SETTLE_MAX: Duration = Duration::from_millis(250);
/// A quiet spell that ends the wait for expected callers: the rest may be behind a timer tick.
const SETTLE_QUIET: Duration = Duration::from_millis(2);

/// What a leader does next while its queue settles.
#[derive(Debug, PartialEq)]
enum Step {
    /// Take the queue as it is.
    Take,
    /// Look again after a turn of the runtime.
    Turn,
    /// Look again after [`SETTLE_QUIET`].
    Sleep,
}

/// The settling rule, apart from the runtime so that it can be tested.
struct Settling {
    expected: usize,
    seen: usize,
    turns: usize,
    quiet: bool,
}

impl Settling {
    fn new(expected: usize, queued: usize) -> Settling {
        Settling {
            expected,
            seen: queued,
            turns: 0,
            quiet: false,
        }
    }

    /// The next step, given the queue's length now and the time since settling began.
    fn look(&mut self, queued: usize, elapsed: Duration) -> Step {
        let grew = queued != self.seen;
        self.seen = queued;
        let short = queued < self.expected && elapsed < SETTLE_MAX;
        if !grew {
            // Quiet over a turn: take it, unless callers are expected and no quiet spell
            // has been waited out yet.
            if short && !self.quiet {
                self.quiet = true;
                return Step::Sleep;
            }
            return Step::Take;
        }
        self.quiet = false;
        self.turns += 1;
        if !short && self.turns >= SETTLE_TURNS {
            return Step::Take;
        }
        Step::Turn
    }
}

impl Drop for Leader<'_> {
    fn drop(&mut self) {
        // Cancelled mid-batch: removing the queue drops the replies not sent, and those callers
        // go alone. (After a clean hand-back the queue may be a new leader's: leave it.)
        if !self.handed_back.load(Ordering::Relaxed) {
            self.group_commit.lock().remove(self.pool);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Duration = Duration::ZERO;

    #[test]
    fn a_lone_caller_is_taken_after_one_quiet_turn() {
        let mut settling = Settling::new(0, 1);
        assert_eq!(settling.look(1, NOW), Step::Take);
    }

    #[test]
    fn with_nobody_expected_a_growing_queue_waits_at_most_settle_turns() {
        let mut settling = Settling::new(0, 0);
        for turn in 1..SETTLE_TURNS {
            assert_eq!(settling.look(turn * 8, NOW), Step::Turn, "turn {turn}");
        }
        assert_eq!(settling.look(SETTLE_TURNS * 8, NOW), Step::Take);
    }

    #[test]
    fn expected_callers_are_waited_for_past_settle_turns() {
        // 4,096 answered, coming back eight a turn: the old rule took 512 of them.
        let mut settling = Settling::new(4096, 0);
        let mut queued = 0;
        while queued < 4096 - 8 {
            queued += 8;
            assert_eq!(settling.look(queued, NOW), Step::Turn, "at {queued}");
        }
        assert_eq!(settling.look(4096, NOW), Step::Take);
    }

    #[test]
    fn a_quiet_turn_short_of_expected_waits_one_quiet_spell() {
        let mut settling = Settling::new(100, 40);
        assert_eq!(settling.look(40, NOW), Step::Sleep);
        // More came in the spell: go on.
        assert_eq!(settling.look(60, NOW), Step::Turn);
        assert_eq!(settling.look(60, NOW), Step::Sleep);
        // Nothing came in the spell: the rest are not coming soon.
        assert_eq!(settling.look(60, NOW), Step::Take);
    }

    #[test]
    fn expected_callers_are_not_waited_for_past_settle_max() {
        let mut settling = Settling::new(4096, 0);
        for turn in 1..=SETTLE_TURNS {
            assert_eq!(settling.look(turn, NOW), Step::Turn);
        }
        assert_eq!(settling.look(SETTLE_TURNS + 1, SETTLE_MAX), Step::Take);
        let mut quiet = Settling::new(4096, 10);
        assert_eq!(quiet.look(10, SETTLE_MAX), Step::Take);
    }
}
