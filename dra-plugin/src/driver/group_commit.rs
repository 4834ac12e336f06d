//! The group commit: concurrent changes queue under one mutex, and whoever
//! queues a change while no commit runs becomes the committer: it takes the
//! whole queue and commits it as one batch outside the mutex, settles every
//! change of the batch under the mutex, wakes all waiters (each collects its
//! own answer), and goes on with whatever queued meanwhile until the queue is
//! empty. So a change is never left in the queue without a committer, and a
//! waiter needs no thread of its own: an async caller waits on a
//! notification, a blocking caller on a condition variable.
//!
//! The engine knows nothing of claims or stores: the caller's state holds a
//! [`CommitQueue`], and the caller gives the commit (I/O, without the mutex)
//! and the settling (under the mutex, answering each ticket). That keeps the
//! batching testable on its own.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Condvar, Mutex, MutexGuard};
use tokio::sync::Notify;

/// A change waiting for the next group commit, with the ticket its caller
/// collects the answer by.
#[derive(Debug)]
pub(crate) struct Queued<T> {
    pub ticket: u64,
    pub change: T,
}

/// The queue of one group-committed state: changes waiting, whether a
/// commit is running, and the answers not yet collected.
#[derive(Debug)]
pub(crate) struct CommitQueue<T, O> {
    /// Changes waiting for the next group commit, in arrival order.
    waiting: Vec<Queued<T>>,
    /// A group commit is running outside the mutex.
    committing: bool,
    /// Answers of committed changes not yet collected by their caller.
    answers: BTreeMap<u64, O>,
    next_ticket: u64,
}

impl<T, O> Default for CommitQueue<T, O> {
    fn default() -> Self {
        CommitQueue {
            waiting: Vec::new(),
            committing: false,
            answers: BTreeMap::new(),
            next_ticket: 0,
        }
    }
}

impl<T, O> CommitQueue<T, O> {
    /// Changes waiting for the next group commit (not counting the one
    /// running).
    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    fn push(&mut self, change: T) -> u64 {
        let ticket = self.next_ticket;
        self.next_ticket = self.next_ticket.wrapping_add(1);
        self.waiting.push(Queued { ticket, change });
        ticket
    }

    /// The whole queue, if no commit is running and something waits; the
    /// caller then runs the commit.
    fn start_batch(&mut self) -> Option<Vec<Queued<T>>> {
        if self.committing || self.waiting.is_empty() {
            return None;
        }
        self.committing = true;
        Some(std::mem::take(&mut self.waiting))
    }

    fn finish_batch(&mut self, answers: Vec<(u64, O)>) {
        self.answers.extend(answers);
        self.committing = false;
    }
}

/// A state guarded by a mutex whose changes are group-committed, and what
/// its waiters wait on: a condition variable for blocking threads and a
/// notification for async tasks, both signalled whenever a group commit ends.
#[derive(Debug)]
pub(crate) struct GroupCommit<S> {
    state: Mutex<S>,
    settled: Condvar,
    settled_async: Notify,
}

/// A change queued by [`GroupCommit::enqueue`]: its ticket, and the batch to
/// commit when the caller became the committer.
#[derive(Debug)]
pub(crate) struct Enqueued<T> {
    pub ticket: u64,
    pub batch: Option<Vec<Queued<T>>>,
}

impl<S> GroupCommit<S> {
    pub fn new(state: S) -> Self {
        GroupCommit {
            state: Mutex::new(state),
            settled: Condvar::new(),
            settled_async: Notify::new(),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, S> {
        // Every mutation leaves the state consistent before any call that
        // could panic, so a poisoned lock still guards valid data.
        shared_state::sync::lock(&self.state)
    }

    /// Release the lock until the next group commit ends.
    pub fn wait<'a>(&self, state: MutexGuard<'a, S>) -> MutexGuard<'a, S> {
        self.settled.wait(state).unwrap_or_else(|p| p.into_inner())
    }

    /// Wait, without a thread, until `check` (called under the mutex now and
    /// after every group commit) answers something.
    pub async fn until<R>(&self, mut check: impl FnMut(&mut S) -> Option<R>) -> R {
        loop {
            // Registered before the look, so that a commit ending between
            // the look and the wait is not missed.
            let settled = self.settled_async.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            if let Some(answer) = check(&mut self.lock()) {
                return answer;
            }
            settled.await;
        }
    }

    /// Queue `change`. When no commit is running the caller becomes the
    /// committer and must hand the returned batch to [`GroupCommit::drain`]
    /// (from a thread that may block): until it does, nothing queued is
    /// committed.
    pub fn enqueue<T, O>(
        &self,
        state: &mut S,
        queue: impl Fn(&mut S) -> &mut CommitQueue<T, O>,
        change: T,
    ) -> Enqueued<T> {
        let queue = queue(state);
        let ticket = queue.push(change);
        Enqueued {
            ticket,
            batch: queue.start_batch(),
        }
    }

    /// The answer of `ticket`, if its group commit has settled it.
    pub fn take_answer<T, O>(
        &self,
        state: &mut S,
        queue: impl Fn(&mut S) -> &mut CommitQueue<T, O>,
        ticket: u64,
    ) -> Option<O> {
        queue(state).answers.remove(&ticket)
    }

    /// Commit `batch` and then every change queued meanwhile, a batch at a
    /// time, until the queue is empty: `commit` runs without the mutex (a
    /// panic in it is caught and handed to `settle`), then `settle` runs
    /// under the mutex and answers each ticket of the batch. Blocks on the
    /// commits' I/O.
    pub fn drain<T, O, C>(
        &self,
        batch: Vec<Queued<T>>,
        queue: impl Fn(&mut S) -> &mut CommitQueue<T, O>,
        commit: impl Fn(&[Queued<T>]) -> C,
        settle: impl Fn(&mut S, Vec<Queued<T>>, std::thread::Result<C>) -> Vec<(u64, O)>,
    ) {
        let mut batch = batch;
        loop {
            let committed = catch_unwind(AssertUnwindSafe(|| commit(&batch)));
            let mut state = self.lock();
            let answers = settle(&mut state, batch, committed);
            let queue = queue(&mut state);
            queue.finish_batch(answers);
            let next = queue.start_batch();
            drop(state);
            self.settled.notify_all();
            self.settled_async.notify_waiters();
            match next {
                Some(next) => batch = next,
                None => return,
            }
        }
    }

    /// Queue `change` and return its answer once a group commit has settled
    /// it, committing (see [`GroupCommit::drain`]) when no commit is running.
    /// Blocks.
    pub fn submit<'a, T, O, C>(
        &'a self,
        mut state: MutexGuard<'a, S>,
        queue: impl Fn(&mut S) -> &mut CommitQueue<T, O>,
        change: T,
        commit: impl Fn(&[Queued<T>]) -> C,
        settle: impl Fn(&mut S, Vec<Queued<T>>, std::thread::Result<C>) -> Vec<(u64, O)>,
    ) -> O {
        let Enqueued { ticket, batch } = self.enqueue(&mut state, &queue, change);
        if let Some(batch) = batch {
            drop(state);
            self.drain(batch, &queue, commit, settle);
            state = self.lock();
        }
        loop {
            if let Some(answer) = self.take_answer(&mut state, &queue, ticket) {
                return answer;
            }
            state = self.wait(state);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;
    use std::time::Duration;

    /// A store stand-in: numbers each change of a batch, in batch order.
    #[derive(Debug, Default)]
    struct Log {
        queue: CommitQueue<u32, Result<u64, String>>,
        /// The changes of each commit, one entry per commit.
        commits: Vec<Vec<u32>>,
        revision: u64,
    }

    fn queue_of(log: &mut Log) -> &mut CommitQueue<u32, Result<u64, String>> {
        &mut log.queue
    }

    /// `threads` callers submit at once (change = their index); each
    /// commit takes `commit_time` and fails when `fails` says so for its
    /// batch. Returns the answers by change and the log.
    fn run(
        threads: u32,
        commit_time: Duration,
        fails: impl Fn(&[u32]) -> bool + Sync,
    ) -> (BTreeMap<u32, Result<u64, String>>, Log) {
        let engine = GroupCommit::new(Log::default());
        let start = Barrier::new(threads as usize);
        let answers = std::thread::scope(|scope| {
            let callers: Vec<_> = (0..threads)
                .map(|change| {
                    let (engine, start, fails) = (&engine, &start, &fails);
                    scope.spawn(move || {
                        start.wait();
                        let answer = engine.submit(
                            engine.lock(),
                            queue_of,
                            change,
                            |batch| {
                                std::thread::sleep(commit_time);
                                let changes: Vec<u32> = batch.iter().map(|q| q.change).collect();
                                (!fails(&changes)).then_some(changes)
                            },
                            |log, batch, committed| match committed {
                                Ok(Some(changes)) => {
                                    log.commits.push(changes);
                                    batch
                                        .into_iter()
                                        .map(|q| {
                                            log.revision += 1;
                                            (q.ticket, Ok(log.revision))
                                        })
                                        .collect()
                                }
                                Ok(None) => batch
                                    .into_iter()
                                    .map(|q| (q.ticket, Err(format!("batch of {}", q.change))))
                                    .collect(),
                                Err(_) => batch
                                    .into_iter()
                                    .map(|q| (q.ticket, Err("panicked".to_string())))
                                    .collect(),
                            },
                        );
                        (change, answer)
                    })
                })
                .collect();
            callers
                .into_iter()
                .map(|caller| {
                    caller
                        .join()
                        .unwrap_or_else(|p| std::panic::resume_unwind(p))
                })
                .collect()
        });
        let log = engine.state.into_inner().unwrap_or_else(|p| p.into_inner());
        (answers, log)
    }

    #[test]
    fn a_lone_change_is_committed_alone() {
        let (answers, log) = run(1, Duration::ZERO, |_| false);
        assert_eq!(answers, BTreeMap::from([(0, Ok(1))]));
        assert_eq!(log.commits, vec![vec![0]]);
        assert_eq!(log.queue.len(), 0);
        assert!(!log.queue.committing);
        assert!(log.queue.answers.is_empty(), "every answer is collected");
    }

    #[test]
    fn concurrent_changes_share_commits_and_each_is_committed_once() {
        // A slow commit lets the others queue behind the first one.
        let (answers, log) = run(16, Duration::from_millis(50), |_| false);
        let mut committed: Vec<u32> = log.commits.iter().flatten().copied().collect();
        committed.sort_unstable();
        assert_eq!(committed, (0..16).collect::<Vec<_>>());
        assert!(
            log.commits.len() < 16,
            "16 concurrent changes took {} commits: none was batched",
            log.commits.len()
        );
        // One revision per change: every caller got a distinct one.
        let mut revisions: Vec<u64> = answers.values().filter_map(|a| a.clone().ok()).collect();
        revisions.sort_unstable();
        assert_eq!(revisions, (1..=16).collect::<Vec<_>>());
    }

    #[test]
    fn changes_are_numbered_in_commit_then_arrival_order() {
        let (answers, log) = run(12, Duration::from_millis(20), |_| false);
        let mut expected = 0;
        for commit in &log.commits {
            for change in commit {
                expected += 1;
                assert_eq!(answers[change], Ok(expected), "change {change}");
            }
        }
        assert_eq!(expected, 12);
    }

    #[test]
    fn a_failed_commit_fails_every_waiter_of_its_batch_and_no_other() {
        // The first commit (a batch holding change 0 or not) succeeds; any
        // later batch holding an odd change fails as a whole.
        let (answers, log) = run(10, Duration::from_millis(30), |batch| {
            batch.iter().any(|c| c % 2 == 1)
        });
        assert!(log
            .commits
            .iter()
            .all(|commit| commit.iter().all(|c| c % 2 == 0)));
        for (change, answer) in &answers {
            let in_a_commit = log.commits.iter().any(|commit| commit.contains(change));
            match answer {
                Ok(_) => assert!(in_a_commit, "change {change} answered Ok uncommitted"),
                Err(reason) => {
                    assert!(!in_a_commit, "change {change} committed but failed");
                    assert!(reason.starts_with("batch of "), "{reason}");
                }
            }
        }
        assert!(answers.values().any(Result::is_err));
        assert!(answers.values().filter(|a| a.is_err()).count() >= 5);
    }

    #[test]
    fn a_panicking_commit_is_settled_and_the_engine_goes_on() {
        let engine = GroupCommit::new(Log::default());
        let panicked = engine.submit(
            engine.lock(),
            queue_of,
            7,
            |_| -> Option<Vec<u32>> { panic!("commit failed unexpectedly") },
            |_, batch, committed| {
                assert!(committed.is_err());
                batch
                    .into_iter()
                    .map(|q| (q.ticket, Err("panicked".to_string())))
                    .collect()
            },
        );
        assert_eq!(panicked, Err("panicked".to_string()));
        let next = engine.submit(
            engine.lock(),
            queue_of,
            8,
            |batch| batch.len(),
            |_, batch, committed| {
                let size = committed.unwrap_or_default() as u64;
                batch.into_iter().map(|q| (q.ticket, Ok(size))).collect()
            },
        );
        assert_eq!(next, Ok(1));
        assert!(!engine.lock().queue.committing);
    }

    #[test]
    fn tickets_are_handed_out_in_arrival_order() {
        let mut queue: CommitQueue<&str, ()> = CommitQueue::default();
        assert_eq!(queue.push("a"), 0);
        assert_eq!(queue.push("b"), 1);
        let batch = queue.start_batch().unwrap_or_default();
        assert_eq!(
            batch
                .iter()
                .map(|q| (q.ticket, q.change))
                .collect::<Vec<_>>(),
            vec![(0, "a"), (1, "b")]
        );
        // A commit is running: the next change waits for it.
        assert_eq!(queue.push("c"), 2);
        assert!(queue.start_batch().is_none());
        queue.finish_batch(vec![(0, ()), (1, ())]);
        assert_eq!(queue.len(), 1);
        assert!(queue.start_batch().is_some());
    }
}
