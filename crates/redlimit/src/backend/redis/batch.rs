//! Checks decided together. A few calls are in flight at once; a check that finds them all
//! busy waits in a queue, and when a call returns, what waits goes as one call (at most
//! [`MAX_MEMBERS`] checks or [`MAX_BYTES`] of keys and arguments), decided in arrival order at
//! one server time. An idle backend sends a check at once, from the caller's own task, so a
//! lone check waits no longer than an unbatched one.
//!
//! On a Cluster each slot has its calls and its queue (a call's keys must be of one slot), so
//! a check never waits behind a call to another node: a dead primary holds up only its own
//! slots' checks.
//!
//! The fixed costs of a call (the `FCALL`, reading the arguments, `TIME`, the reply and the
//! socket) are then paid once per batch instead of once
//! per decision: that is most of what a decision costs the Redis core.

use std::{
    collections::VecDeque,
    ops::{Deref, Range},
    sync::{Arc, Mutex, PoisonError},
};

use tokio::{sync::oneshot, time::Instant};

use super::{RedisBackend, protocol::Call};
use crate::{Algorithm, Error, ErrorKind};

/// Calls in flight at once before checks queue. Enough that Redis never waits for the next
/// call while one travels back; few enough that checks queue (and batch) as soon as Redis is
/// busy.
const IN_FLIGHT: usize = 2;
/// The most checks in one call.
const MAX_MEMBERS: usize = 64;
/// The most bytes of keys and arguments in one call.
const MAX_BYTES: usize = 16 * 1024;

/// One check, encoded alone, and where its reply goes.
pub(crate) struct Member {
    /// Boxed: held inline, its arguments make it large, and a member moves from the check's
    /// future to its batch's queue.
    pub(crate) call: Box<Call>,
    /// The algorithm whose lean script runs it alone, if one can.
    pub(crate) lean: Option<Algorithm>,
    /// How many integers its reply is.
    pub(crate) reply_len: usize,
    /// Only checks of one slot (the client's hash tag) go in one Cluster call; 0 elsewhere.
    pub(crate) slot: u16,
    pub(crate) deadline: Instant,
}

struct Waiting {
    member: Member,
    reply: oneshot::Sender<Result<Replied, Error>>,
}

/// A check's integers of a reply: its own call's, or its part of a batch's, shared by the
/// batch's checks instead of copied out for each.
pub(crate) enum Replied {
    Own(Vec<i64>),
    Part(Arc<[i64]>, Range<usize>),
}

impl Deref for Replied {
    type Target = [i64];

    fn deref(&self) -> &[i64] {
        match self {
            Self::Own(reply) => reply,
            Self::Part(reply, at) => reply.get(at.clone()).unwrap_or_default(),
        }
    }
}

/// The queues of one backend: one, or on a Cluster one per slot.
pub(crate) struct Batcher {
    states: Mutex<Box<[State]>>,
}

#[derive(Default)]
struct State {
    in_flight: usize,
    queue: VecDeque<Waiting>,
}

/// A call in flight for `slot`'s queue. Dropped (answered or given up), it sends what waits
/// there, or frees its place.
struct Turn {
    redis: RedisBackend,
    slot: u16,
}

impl Batcher {
    /// Queues for a Cluster (one per slot) or for one server.
    pub(crate) fn new(cluster: bool) -> Self {
        let queues = if cluster { 16_384 } else { 1 };
        Self {
            states: Mutex::new((0..queues).map(|_| State::default()).collect()),
        }
    }

    /// Runs `f` on the state of `slot`'s queue.
    fn with<T>(&self, slot: u16, f: impl FnOnce(&mut State) -> T) -> T {
        let mut states = self.states.lock().unwrap_or_else(PoisonError::into_inner);
        let queues = states.len();
        f(&mut states[usize::from(slot) % queues])
    }
}

impl RedisBackend {
    /// Decides `member`: sent at once when fewer than [`IN_FLIGHT`] calls are out, else with the
    /// next batch. Queued (or its place in flight taken) when called, not when first polled;
    /// dropped, it gives its place back. The caller's timer bounds both waits.
    ///
    /// Not an `async fn`: one would keep the member three times over in its state (the
    /// argument, the queue's refusal, the bound name), a future of 1,048 bytes where this one
    /// keeps it once. The call a member sends itself is boxed: every check's future would
    /// otherwise hold its 650 bytes, where a queued one never sends it (a check's future on
    /// Redis, 1,320 -> 672 bytes, within the allocator's per-thread cache of small blocks).
    /// Instructions per request of the layer on Redis, callgrind over the HTTP mode's server
    /// thread: 78 fewer.
    pub(crate) fn decide(
        &self,
        member: Member,
    ) -> impl Future<Output = Result<Replied, Error>> + Send + '_ {
        let slot = member.slot;
        let mut queued = self.inner.batcher.with(slot, |state| {
            if state.in_flight < IN_FLIGHT {
                state.in_flight += 1;
                Err(member)
            } else {
                let (reply, answer) = oneshot::channel();
                state.queue.push_back(Waiting { member, reply });
                Ok(answer)
            }
        });
        // Sent by this future: its place in flight is held until it ends or is dropped.
        let turn = queued.is_err().then(|| Turn {
            redis: self.clone(),
            slot,
        });
        async move {
            let _turn = turn;
            match &mut queued {
                Ok(answer) => answer.await.unwrap_or_else(|_| {
                    Err(Error::new(
                        ErrorKind::Backend,
                        "the batch of this check was dropped",
                    ))
                }),
                Err(member) => {
                    Box::pin(self.call_script(&member.call, self.inner.scripts.of(member.lean)))
                        .await
                        .map(Replied::Own)
                }
            }
        }
    }

    /// Sends `batch` (of one slot), a call per time, and answers each member.
    async fn send(&self, batch: Vec<Waiting>) {
        let mut groups: Vec<Vec<Waiting>> = Vec::new();
        for waiting in batch {
            let time = waiting.member.call.time();
            match groups.iter_mut().find(|g| g[0].member.call.time() == time) {
                Some(group) => group.push(waiting),
                None => groups.push(vec![waiting]),
            }
        }
        let mut sends = tokio::task::JoinSet::new();
        let last = groups.len().saturating_sub(1);
        for (i, group) in groups.into_iter().enumerate() {
            if i == last {
                self.send_group(group).await;
            } else {
                let redis = self.clone();
                sends.spawn(async move { redis.send_group(group).await });
            }
        }
        while sends.join_next().await.is_some() {}
    }

    /// One call for `group` (checks of one slot at one time), within the latest budget of its
    /// members. The script stops at a check whose state is corrupt and answers only the checks
    /// before it (their writes stand); that check and the rest are sent again a check at a time,
    /// so only the client whose key is corrupt sees it and none is counted twice.
    async fn send_group(&self, mut group: Vec<Waiting>) {
        let deadline = group
            .iter()
            .map(|w| w.member.deadline)
            .max()
            .unwrap_or_else(Instant::now);
        if group.len() == 1 {
            for waiting in group {
                self.send_alone(waiting).await;
            }
            return;
        }
        let call = Call::joined(group.iter_mut().map(|w| &mut *w.member.call));
        let reply = self
            .within(
                deadline,
                self.call_script(&call, self.inner.scripts.of(None)),
            )
            .await
            .map(Arc::<[i64]>::from);
        let stopped = match &reply {
            // Failed at the first check, before any was decided.
            Err(err) => err.is_corrupt_state(),
            Ok(reply) => reply.len() < group.iter().map(|w| w.member.reply_len).sum(),
        };
        if !stopped {
            return answer(group, reply);
        }
        call.give_back_keys(group.iter_mut().map(|w| &mut *w.member.call));
        let rest = match reply {
            Ok(reply) => answer_decided(group, &reply),
            Err(_) => group,
        };
        let mut alone = tokio::task::JoinSet::new();
        for waiting in rest {
            let redis = self.clone();
            alone.spawn(async move { redis.send_alone(waiting).await });
        }
        while alone.join_next().await.is_some() {}
    }
}

impl RedisBackend {
    /// One call for one check, by its own script, within its own budget.
    async fn send_alone(&self, waiting: Waiting) {
        let member = &waiting.member;
        let script = self.inner.scripts.of(member.lean);
        let reply = self
            .within(member.deadline, self.call_script(&member.call, script))
            .await;
        answer(vec![waiting], reply.map(Arc::from));
    }

    /// `call`, or a timeout at `deadline`.
    async fn within(
        &self,
        deadline: Instant,
        call: impl Future<Output = Result<Vec<i64>, Error>>,
    ) -> Result<Vec<i64>, Error> {
        tokio::time::timeout_at(deadline, call)
            .await
            .unwrap_or_else(|_| {
                self.after_timeout();
                Err(Error::new(
                    ErrorKind::Timeout,
                    "redis did not answer a batch within its checks' budgets",
                ))
            })
    }
}

/// Hands each member its part of `reply`; a failed call fails each one, counted once by a
/// circuit breaker.
fn answer(group: Vec<Waiting>, reply: Result<Arc<[i64]>, Error>) {
    match reply {
        Ok(reply) if reply.len() == group.iter().map(|w| w.member.reply_len).sum() => {
            answer_decided(group, &reply);
        }
        Ok(reply) => {
            let err = Error::new(
                ErrorKind::Backend,
                format!(
                    "a batch of {} checks was answered {} integers",
                    group.len(),
                    reply.len()
                ),
            );
            fail(group, &err);
        }
        Err(err) => fail(group, &err),
    }
}

/// Hands each member of `group` decided in `reply` (a batch's replies, or those up to the check
/// it stopped at) its part; returns the members after them.
fn answer_decided(group: Vec<Waiting>, reply: &Arc<[i64]>) -> Vec<Waiting> {
    let mut at = 0;
    let mut members = group.into_iter();
    for waiting in members.by_ref() {
        let end = at + waiting.member.reply_len;
        if reply.len() < end {
            return std::iter::once(waiting).chain(members).collect();
        }
        let _ = waiting
            .reply
            .send(Ok(Replied::Part(Arc::clone(reply), at..end)));
        at = end;
    }
    Vec::new()
}

fn fail(group: Vec<Waiting>, err: &Error) {
    let copies = err.copies(group.len());
    for (waiting, err) in group.into_iter().zip(copies) {
        let _ = waiting.reply.send(Err(err));
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let batch = self.redis.inner.batcher.with(self.slot, |state| {
            let mut batch = Vec::with_capacity(state.queue.len().min(MAX_MEMBERS));
            let mut bytes = 0;
            while let Some(waiting) = state.queue.front() {
                let size = waiting.member.call.size();
                if batch.len() == MAX_MEMBERS || (!batch.is_empty() && bytes + size > MAX_BYTES) {
                    break;
                }
                let waiting = state.queue.pop_front().expect("a front");
                // Its caller gave up (out of budget): nothing to send.
                if waiting.reply.is_closed() {
                    continue;
                }
                bytes += size;
                batch.push(waiting);
            }
            if batch.is_empty() {
                state.in_flight -= 1;
            }
            batch
        });
        if batch.is_empty() {
            return;
        }
        // The place in flight passes to the batch.
        let turn = Turn {
            redis: self.redis.clone(),
            slot: self.slot,
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    turn.redis.send(batch).await;
                    drop(turn);
                });
            }
            Err(_) => {
                // No runtime to send it from (shutting down): each check fails now.
                let err = Error::new(ErrorKind::Backend, "the runtime is shutting down");
                fail(batch, &err);
                drop(turn);
            }
        }
    }
}
