//! Work that holds a thread for long: a whole pool's record loaded (750,000 holdings take
//! seconds), a group commit's round decided. In `sync --watch` the webhook answers pods on the
//! same runtime, and an async worker held by such work holds every admission queued on it.
//! So on a multi-threaded runtime the work is done in place and the worker's queue is handed to
//! another thread first (`block_in_place`); on the CLI's single thread nothing else waits, and
//! it is simply run.

use tokio::runtime::{Handle, RuntimeFlavor};

/// Run `work`, off the async workers when there are several of them.
pub fn cpu_bound<R>(work: impl FnOnce() -> R) -> R {
    match Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(work)
        }
        _ => work(),
    }
}

#[cfg(test)]
mod tests {
    use super::cpu_bound;

    #[test]
    fn outside_a_runtime_the_work_runs_here() {
        assert_eq!(cpu_bound(|| 6 * 7), 42);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn on_one_thread_the_work_runs_in_place() {
        let here = std::thread::current().id();
        assert_eq!(cpu_bound(|| std::thread::current().id()), here);
    }

    /// While the only worker is in the work, a task queued behind it still runs (on the thread
    /// that takes the worker's place): the guarantee the webhook needs from the watcher's long
    /// decisions. Without the hand-off the task would wait until the work ended, and the work
    /// here waits for the task.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn on_a_multi_threaded_runtime_queued_tasks_keep_running() {
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let (answered_tx, answered_rx) = std::sync::mpsc::channel::<()>();
        let busy = tokio::spawn(async move {
            cpu_bound(|| {
                started_tx.send(()).unwrap();
                // Held until the other task has answered: without the hand-off a task queued on
                // this worker could wait here forever.
                answered_rx
                    .recv_timeout(std::time::Duration::from_secs(10))
                    .is_ok()
            })
        });
        tokio::task::spawn_blocking(move || started_rx.recv().unwrap())
            .await
            .unwrap();
        let answer = tokio::spawn(async move { answered_tx.send(()).is_ok() });
        assert!(answer.await.unwrap());
        assert!(
            busy.await.unwrap(),
            "the queued task did not run while the work held its worker"
        );
    }
}
