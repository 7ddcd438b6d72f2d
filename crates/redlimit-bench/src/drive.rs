//! Runs N operations at concurrency C over K keys and times each one.

use std::{
    future::Future,
    sync::Arc,
    time::{Duration, Instant},
};

use deadpool_redis::redis;
use redlimit_tests::{command_calls, commands_sent};

use crate::{Settings, report::Tally};

/// The order contenders take in `round`: a balanced Latin square (Williams' design), so over
/// every `n` rounds (`2n` for an odd number of contenders) each one takes every place equally
/// often and follows every other one equally often. Both matter: a fixed order put
/// http_memory, always second, 0.03 lower at the median in six paired HTTP runs here; a
/// rotation, which keeps each contender's predecessor, moved the HTTP ratio of whichever
/// contender followed http_redis up by 0.02 to 0.07 (three runs, and the gain followed it when
/// two contenders swapped places). The default 24 rounds complete the design twelve times for
/// the flood's 2 contenders; a mode whose count does not divide 24 (the HTTP mode's 10, say)
/// gets its whole squares and some rounds of another.
pub(crate) fn round_order(round: usize, contenders: usize) -> impl Iterator<Item = usize> {
    let n = contenders.max(1);
    let (shift, reversed) = (round % n, n % 2 == 1 && (round / n) % 2 == 1);
    (0..contenders).map(move |place| {
        let place = if reversed { n - 1 - place } else { place };
        // 0, 1, n-1, 2, n-2, …: every difference between neighbours occurs once.
        let column = if place % 2 == 1 {
            place.div_ceil(2)
        } else {
            (n - place / 2) % n
        };
        (column + shift) % n
    })
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
    let schedule = Schedule::new(settings);
    for round in 0..schedule.rounds {
        for at in round_order(round, contenders.len()) {
            let (contender, tally) = (&contenders[at], &mut tallies[at]);
            let before = command_calls(admin);
            let (latencies, elapsed) = drive(Arc::new(op(contender)), schedule, round).await;
            tally.add(
                latencies,
                elapsed,
                commands_sent(&before, &command_calls(admin)),
            );
        }
    }
    tallies
}

/// The `k`th client's name.
pub(crate) fn client(k: usize) -> String {
    format!("client-{k}")
}

/// A contender that decides for a client, as [`over_clients`] drives it.
pub(crate) trait Decide: Send + Sync + 'static {
    /// Decides one request of `client`.
    fn decide(&self, client: &str) -> impl Future<Output = ()> + Send;
}

/// Runs each contender's decisions over the clients `client-0` to `client-{K-1}` in interleaved
/// rounds (see [`interleaved`]).
pub(crate) async fn over_clients<N, C: Decide>(
    contenders: &[(N, Arc<C>)],
    settings: &Settings,
    admin: &mut redis::Connection,
) -> Vec<Tally> {
    let clients: Arc<[String]> = (0..settings.keys).map(client).collect();
    interleaved(contenders, settings, admin, |(_, contender)| {
        let (contender, clients) = (Arc::clone(contender), Arc::clone(&clients));
        move |key: usize| {
            let (contender, clients) = (Arc::clone(&contender), Arc::clone(&clients));
            async move { contender.decide(&clients[key]).await }
        }
    })
    .await
}

/// Which key each call uses: task `task`'s `j`th call of `round` uses key
/// (round × N / R + task + j × C) mod K, so concurrent calls use different keys and the rounds
/// sweep the keys in turn. N / R / C calls a task, a round; the remainder of N is not run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Schedule {
    per_round: usize,
    pub(crate) per_task: usize,
    pub(crate) concurrency: usize,
    pub(crate) rounds: usize,
    keys: usize,
}

impl Schedule {
    pub(crate) fn new(settings: &Settings) -> Self {
        let per_round = settings.decisions / settings.rounds;
        Self {
            per_round,
            per_task: per_round / settings.concurrency,
            concurrency: settings.concurrency,
            rounds: settings.rounds,
            keys: settings.keys,
        }
    }

    pub(crate) fn key(self, round: usize, task: usize, j: usize) -> usize {
        (round * self.per_round + task + j * self.concurrency) % self.keys
    }

    /// How many calls a contender makes in all its rounds.
    pub(crate) fn calls(self) -> usize {
        self.per_task * self.concurrency * self.rounds
    }

    /// The keys the last round used, the latest first: their state is still in Redis when the
    /// run ends, where keys used early may have expired with their window.
    pub(crate) fn last_round_keys(self) -> impl Iterator<Item = usize> {
        let round = self.rounds - 1;
        (0..self.per_task).rev().flat_map(move |j| {
            (0..self.concurrency)
                .rev()
                .map(move |task| self.key(round, task, j))
        })
    }
}

/// Runs one round of `schedule` with `op` (given each call's key index) from its concurrent
/// tasks, and returns every call's latency in microseconds and the wall time.
async fn drive<F, Fut>(op: Arc<F>, schedule: Schedule, round: usize) -> (Vec<u32>, Duration)
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let started = Instant::now();
    let tasks: Vec<_> = (0..schedule.concurrency)
        .map(|task| {
            let op = Arc::clone(&op);
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(schedule.per_task);
                for j in 0..schedule.per_task {
                    let begun = Instant::now();
                    op(schedule.key(round, task, j)).await;
                    latencies.push(u32::try_from(begun.elapsed().as_micros()).unwrap_or(u32::MAX));
                }
                latencies
            })
        })
        .collect();
    let mut all = Vec::with_capacity(schedule.per_task * schedule.concurrency);
    for task in tasks {
        all.extend(task.await.expect("a benchmark task panicked"));
    }
    (all, started.elapsed())
}

#[cfg(test)]
mod tests {
    use super::round_order;

    #[test]
    fn every_contender_takes_every_place_and_follows_every_other_equally_often() {
        for n in 1..=9 {
            let rounds = if n % 2 == 0 { n } else { 2 * n };
            let mut places = vec![vec![0; n]; n];
            let mut follows = vec![vec![0; n]; n];
            for round in 0..rounds {
                let order: Vec<usize> = round_order(round, n).collect();
                let mut sorted = order.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "round {round} of {n}");
                for (place, &at) in order.iter().enumerate() {
                    places[place][at] += 1;
                }
                for pair in order.windows(2) {
                    follows[pair[0]][pair[1]] += 1;
                }
            }
            let each = rounds / n;
            assert!(places.iter().flatten().all(|&c| c == each), "places of {n}");
            for (a, row) in follows.iter().enumerate() {
                for (b, &count) in row.iter().enumerate() {
                    let expected = if a == b { 0 } else { each };
                    assert_eq!(count, expected, "{b} after {a} of {n}");
                }
            }
        }
    }
}
