//! Runs N operations at concurrency C over K keys and times each one.

use std::{
    future::Future,
    sync::Arc,
    time::{Duration, Instant},
};

use deadpool_redis::redis;
use redlimit_tests::{command_calls, commands_sent};

use crate::{Settings, report::Tally};

/// The order contenders take in `round`: each goes first in turn, so what a place in the round
/// gains or loses is shared alike (in six paired HTTP runs here, a fixed order put http_memory,
/// always second, 0.03 lower at the median). With the default 24 rounds every contender of
/// every mode (8, 4 or 2 of them) takes every place equally often.
pub(crate) fn round_order(round: usize, contenders: usize) -> impl Iterator<Item = usize> {
    (0..contenders).map(move |i| (round + i) % contenders)
}

/// Runs each contender's share of the decisions in interleaved rounds (so drift on a shared
/// machine touches all alike), counting the Redis commands each one sends. `op` gives a
/// contender's operation on a key index.
pub(crate) async fn interleaved<C, F, Fut>(
    contenders: &[C],
    settings: &Settings,
    admin: &mut redis::Connection,
    op: impl Fn(&C) -> F,
) -> Vec<Tally>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let mut tallies: Vec<Tally> = contenders.iter().map(|_| Tally::default()).collect();
    let per_round = settings.decisions / settings.rounds;
    for round in 0..settings.rounds {
        for at in round_order(round, contenders.len()) {
            let (contender, tally) = (&contenders[at], &mut tallies[at]);
            let before = command_calls(admin);
            let (latencies, elapsed) = drive(
                Arc::new(op(contender)),
                per_round,
                settings.concurrency,
                settings.keys,
                round * per_round,
            )
            .await;
            tally.add(
                latencies,
                elapsed,
                commands_sent(&before, &command_calls(admin)),
            );
        }
    }
    tallies
}

/// The key indices the last round used, the latest first: their state is still in Redis when
/// the run ends, where keys used early may have expired with their window.
pub(crate) fn last_round_keys(settings: &Settings) -> impl Iterator<Item = usize> {
    let per_round = settings.decisions / settings.rounds;
    let used = per_round / settings.concurrency * settings.concurrency;
    let offset = (settings.rounds - 1) * per_round;
    let keys = settings.keys;
    (0..used).rev().map(move |n| (offset + n) % keys)
}

/// Runs `n` calls of `op` (each given a key index below `keys`) from `concurrency` tasks, and
/// returns every call's latency in microseconds and the wall time.
async fn drive<F, Fut>(
    op: Arc<F>,
    n: usize,
    concurrency: usize,
    keys: usize,
    offset: usize,
) -> (Vec<u32>, Duration)
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let per_task = n / concurrency;
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|task| {
            let op = Arc::clone(&op);
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(per_task);
                for j in 0..per_task {
                    let key = (offset + task + j * concurrency) % keys;
                    let begun = Instant::now();
                    op(key).await;
                    latencies.push(u32::try_from(begun.elapsed().as_micros()).unwrap_or(u32::MAX));
                }
                latencies
            })
        })
        .collect();
    let mut all = Vec::with_capacity(n);
    for task in tasks {
        all.extend(task.await.expect("a benchmark task panicked"));
    }
    (all, started.elapsed())
}
