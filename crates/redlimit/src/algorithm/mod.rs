//! The six algorithms in plain integer arithmetic: the in-memory backend runs them, and each
//! mirrors its Lua script in the crate's `lua/` folder step for step so both backends decide identically.
//!
//! A check is planned against the state as read, then applied only if every policy of the check
//! admits it (all-or-nothing).

mod bucket;
mod counter;
mod gcra;
mod log;
mod settle;
mod window;

use std::collections::VecDeque;

pub(crate) use self::settle::{charge, refund, refund_now};
use crate::{Algorithm, Policy};

/// What one key holds, per algorithm. Times are milliseconds except GCRA's microseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum State {
    /// Fixed windows, aligned or anchored: the window's start and its count.
    Window { start: u64, count: u64 },
    /// Admitted request times, ascending.
    Log(VecDeque<u64>),
    /// Sliding window counter: the current window's index and two counts.
    Counter { window: u64, prev: u64, curr: u64 },
    /// Token bucket: tokens taken, scaled by the window (tokens × window_ms), and the last
    /// refill.
    Bucket { used: u64, last: u64 },
    /// GCRA's theoretical arrival time and the emission interval it was reached by, in
    /// microseconds.
    Gcra { tat: u64, interval: u64 },
}

/// What a client sees of its quota at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct View {
    pub(crate) remaining: u64,
    pub(crate) reset_ms: u64,
}

/// Why a request is denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Denial {
    /// It could pass after this many milliseconds.
    RetryAfterMs(u64),
    /// Its cost exceeds the policy's capacity.
    Never,
}

/// A change to one key's state, with the key's new time to live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Write {
    pub(crate) update: Update,
    pub(crate) ttl_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Update {
    /// The key's whole state becomes this.
    Replace(State),
    /// `count` entries at `at` join the log; entries at or before `at - window` leave it, and
    /// with `keep`, all but the newest `keep`.
    LogAppend {
        at: u64,
        count: u64,
        window: u64,
        keep: Option<u64>,
    },
}

/// The outcome of planning one policy's check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The quota as it is, for when nothing is consumed.
    pub(crate) before: View,
    /// Admitted: the quota after consuming and the write that consumes (none for cost 0).
    /// Denied: why.
    pub(crate) outcome: Result<(View, Option<Write>), Denial>,
    /// Delay mode: how long an admitted request waits for its slot, in milliseconds.
    pub(crate) delay_ms: u64,
}

impl Plan {
    fn denied(before: View, denial: Denial) -> Self {
        Self {
            before,
            outcome: Err(denial),
            delay_ms: 0,
        }
    }

    fn admitted(before: View, after: View, write: Write, cost: u64) -> Self {
        Self {
            before,
            outcome: Ok((after, (cost > 0).then_some(write))),
            delay_ms: 0,
        }
    }
}

/// Plans a check of `cost` at `now_us` against `state`, which may be stale or absent.
pub(crate) fn plan(policy: &Policy, state: Option<&State>, now_us: u64, cost: u64) -> Plan {
    let now_ms = now_us / 1000;
    match policy.algorithm() {
        Algorithm::FixedWindow => window::plan(policy, state, now_ms, cost, true),
        Algorithm::FixedWindowAnchored => window::plan(policy, state, now_ms, cost, false),
        Algorithm::SlidingWindowLog => log::plan(policy, state, now_ms, cost),
        Algorithm::SlidingWindowCounter => counter::plan(policy, state, now_ms, cost),
        Algorithm::TokenBucket => bucket::plan(policy, state, now_ms, cost),
        Algorithm::Gcra => gcra::plan(policy, state, now_us, cost),
    }
}

/// Applies a planned write to a key's state.
pub(crate) fn apply(state: &mut Option<State>, update: Update) {
    match update {
        Update::Replace(new) => *state = Some(new),
        Update::LogAppend {
            at,
            count,
            window,
            keep,
        } => {
            let entries = match state {
                Some(State::Log(entries)) => entries,
                _ => state.insert(State::Log(VecDeque::new())).as_log_mut(),
            };
            let expired = entries.partition_point(|&t| t + window <= at);
            entries.drain(..expired);
            let position = entries.partition_point(|&t| t <= at);
            for _ in 0..count {
                entries.insert(position, at);
            }
            if let Some(keep) = keep.and_then(|keep| usize::try_from(keep).ok()) {
                let over = entries.len().saturating_sub(keep);
                entries.drain(..over);
            }
        }
    }
}

impl State {
    /// The state as field, value pairs named as the scripts store them in Redis.
    pub(crate) fn fields(&self) -> Vec<(String, String)> {
        let pairs: &[(&str, u64)] = match self {
            Self::Window { start, count } => &[("s", *start), ("n", *count)],
            Self::Log(entries) => &[("entries", entries.len() as u64)],
            Self::Counter { window, prev, curr } => &[("w", *window), ("p", *prev), ("c", *curr)],
            Self::Bucket { used, last } => &[("u", *used), ("l", *last)],
            Self::Gcra { tat, interval } => &[("tat", *tat), ("interval", *interval)],
        };
        pairs
            .iter()
            .map(|(field, value)| ((*field).to_owned(), value.to_string()))
            .collect()
    }

    fn as_log_mut(&mut self) -> &mut VecDeque<u64> {
        match self {
            Self::Log(entries) => entries,
            _ => unreachable!("just inserted a log"),
        }
    }
}
