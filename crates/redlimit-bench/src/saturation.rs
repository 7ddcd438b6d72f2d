//! Redis CPU per decision at saturation, through the clients users run: two client threads,
//! each with its own runtime and connection (as two application processes), keep 256 checks in
//! flight apiece, so redis-server's core is the bottleneck for every contender, the naive
//! script's included. Keys are uniform over K clients, or Zipf-distributed (s = 1.1: a few hot
//! clients, a long tail). Redis CPU is the server process's own (`INFO cpu`) over the run.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use deadpool_redis::redis::{self, aio::MultiplexedConnection};
use redlimit::{Algorithm, Limiter, Policy, PolicySet};
use redlimit_tests::script_calls;

use crate::{
    Settings,
    decisions::{NAIVE, NAIVE_SCRIPT, admin, redis_limiter},
    process_cpu::process_cpu,
    report::Row,
    saturate::server_cpu,
};

/// Client threads, and checks in flight on each.
const THREADS: usize = 2;
const IN_FLIGHT: usize = 256;
/// Zipf's exponent for the skewed rows.
const ZIPF_S: f64 = 1.1;

/// One way of deciding.
#[derive(Clone)]
pub(crate) enum Contender {
    /// The naive script by `EVALSHA`, one call per decision: what a user writes.
    Naive { url: String, sha1: String },
    /// redlimit checking `set` (each thread builds its own limiter on `url`), each policy
    /// under the check's client but from `split` on, under a key of its own (per IP and per API
    /// key).
    Redlimit {
        url: String,
        set: Arc<PolicySet>,
        split: Option<usize>,
    },
}

/// A limit so high that every check of the run is allowed (the hottest Zipf client takes about
/// a tenth of a run), but for the sliding log's, which keeps an entry per request (limit 100, as
/// the rows say). Below 1,000,000, so that fixed windows keep their one-string state, as
/// any limit of a client (not of a whole service) does.
pub(crate) fn generous(algorithm: Algorithm) -> Policy {
    generous_in(algorithm, None)
}

/// [`generous`], in key group `group` if given.
fn generous_in(algorithm: Algorithm, group: Option<&str>) -> Policy {
    let limit = if algorithm == Algorithm::SlidingWindowLog {
        100
    } else {
        100_000
    };
    let policy = Policy::builder(algorithm.name(), algorithm)
        .limit(limit)
        .window(Duration::from_secs(60));
    match group {
        Some(group) => policy.key_group(group),
        None => policy,
    }
    .build()
    .expect("a valid policy")
}

pub(crate) fn contenders(url: &str, naive_sha1: &str) -> Vec<(String, Contender)> {
    let mut all = vec![(
        NAIVE.to_owned(),
        Contender::Naive {
            url: url.to_owned(),
            sha1: naive_sha1.to_owned(),
        },
    )];
    let redlimit = |set: PolicySet, split: Option<usize>| Contender::Redlimit {
        url: url.to_owned(),
        set: Arc::new(set),
        split,
    };
    for algorithm in Algorithm::ALL {
        all.push((
            algorithm.name().to_owned(),
            redlimit(PolicySet::from(generous(algorithm)), None),
        ));
    }
    // Generous as the others are, and below the 500,000 from which a fixed window keeps a hash.
    let per_hour = Policy::builder("per_hour", Algorithm::FixedWindow)
        .limit(400_000)
        .window(Duration::from_secs(3_600))
        .build()
        .expect("a valid policy");
    let two = PolicySet::new([generous(Algorithm::FixedWindow), per_hour]).expect("a valid set");
    all.push((
        crate::decisions::TWO_POLICIES.to_owned(),
        redlimit(two.clone(), None),
    ));
    // The same two policies, the second under another key in the same slot (as a tenant tag
    // keeps it on a Cluster): what one check of two keys costs Redis beside one key.
    all.push((
        format!("{}_two_keys", crate::decisions::TWO_POLICIES),
        redlimit(two, Some(1)),
    ));
    for combined in COMBINED {
        all.push((
            combined.name.to_owned(),
            redlimit(combined.set(), combined.split),
        ));
    }
    all
}

/// A check of several policies whose cost is weighed against its members checked alone (the
/// rows named after their algorithms).
pub(crate) struct Combined {
    pub(crate) name: &'static str,
    pub(crate) members: &'static [Algorithm],
    /// Where the second key's policies begin, if there is one.
    pub(crate) split: Option<usize>,
    /// The key group the members under its last key keep their state in, if any; those under
    /// the first key of a split check keep keys of their own (per IP, beside a key's group).
    pub(crate) group: Option<&'static str>,
}

impl Combined {
    /// Its members, each as generous as the rows it is weighed against.
    pub(crate) fn set(&self) -> PolicySet {
        let grouped_from = self.split.unwrap_or(0);
        PolicySet::new(self.members.iter().enumerate().map(|(i, &algorithm)| {
            generous_in(algorithm, self.group.filter(|_| i >= grouped_from))
        }))
        .expect("a valid set")
    }
}

/// Per IP, then a key's rate and burst.
const PER_IP_AND_KEY: &[Algorithm] = &[
    Algorithm::FixedWindow,
    Algorithm::Gcra,
    Algorithm::TokenBucket,
];

pub(crate) const COMBINED: &[Combined] = &[
    Combined {
        name: "fixed_window+gcra",
        members: &[Algorithm::FixedWindow, Algorithm::Gcra],
        split: None,
        group: None,
    },
    Combined {
        name: "fw+gcra+tb_two_keys",
        members: PER_IP_AND_KEY,
        split: Some(1),
        group: None,
    },
    // The same, each client's states in one key (`PolicyBuilder::key_group`).
    Combined {
        name: "fixed_window+gcra_one_key",
        members: &[Algorithm::FixedWindow, Algorithm::Gcra],
        split: None,
        group: Some("one"),
    },
    Combined {
        name: "fw+gcra+tb_two_keys_one_key",
        members: PER_IP_AND_KEY,
        split: Some(1),
        group: Some("one"),
    },
];

/// Prints each combined check's figure (`value` of its row) over the sum of its members'.
pub(crate) fn print_sums(rows: &[Row], what: &str, value: impl Fn(&Row) -> Option<f64>) {
    let of = |name: &str| {
        rows.iter()
            .find(|row| row.contender == name)
            .and_then(&value)
    };
    for Combined { name, members, .. } in COMBINED {
        let sum: Option<f64> = members.iter().map(|member| of(member.name())).sum();
        if let Some((combined, sum)) = of(name).zip(sum) {
            println!(
                "{name}: {what} {combined:.2} against its members' sum {sum:.2}: {:.3}×",
                combined / sum
            );
        }
    }
}

/// Which client each check is for: uniform, or Zipf over `keys` ranks (inverse CDF).
#[derive(Clone)]
pub(crate) struct Keys {
    cdf: Option<Arc<[f64]>>,
    keys: usize,
}

impl Keys {
    pub(crate) fn uniform(keys: usize) -> Self {
        Self { cdf: None, keys }
    }

    pub(crate) fn zipf(keys: usize) -> Self {
        let weights: Vec<f64> = (1..=keys).map(|k| 1.0 / (k as f64).powf(ZIPF_S)).collect();
        let total: f64 = weights.iter().sum();
        let mut sum = 0.0;
        let cdf = weights
            .iter()
            .map(|w| {
                sum += w / total;
                sum
            })
            .collect();
        Self {
            cdf: Some(cdf),
            keys,
        }
    }

    /// The client for a uniform random `u` in [0, 1).
    // u * keys is below keys, far inside usize.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    pub(crate) fn pick(&self, u: f64) -> usize {
        match &self.cdf {
            None => ((u * self.keys as f64) as usize).min(self.keys - 1),
            Some(cdf) => cdf.partition_point(|&c| c < u).min(self.keys - 1),
        }
    }
}

/// xorshift64*: a cheap, seedable stream of uniforms for the key picks.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1_u64 << 53) as f64
    }
}

/// What a thread's checks go through.
#[derive(Clone)]
enum Client {
    Naive(MultiplexedConnection, Arc<str>),
    Redlimit(Limiter, Arc<PolicySet>, Option<usize>),
}

impl Client {
    async fn decide(&self, client: &str) {
        match self {
            Self::Naive(conn, sha1) => {
                let window = redlimit::Timestamp::now().as_micros() / 60_000_000;
                let count: u64 = redis::cmd("EVALSHA")
                    .arg(&**sha1)
                    .arg(1)
                    .arg(format!("naive:{{{client}}}:{window}"))
                    .arg(60)
                    .query_async(&mut conn.clone())
                    .await
                    .expect("naive EVALSHA");
                std::hint::black_box(count <= 1_000_000);
            }
            Self::Redlimit(limiter, set, split) => {
                let check = limiter.check(set, client);
                let decisions = if let Some(split) = *split {
                    let key = format!("key:{client}");
                    let keys: Vec<&str> = (0..set.len())
                        .map(|i| if i < split { client } else { key.as_str() })
                        .collect();
                    check.keys(&keys).await
                } else {
                    check.await
                };
                std::hint::black_box(decisions.expect("redlimit check").allowed());
            }
        }
    }
}

/// One thread: its own runtime and connection, `IN_FLIGHT` tasks taking checks from `left`.
fn thread(
    contender: Contender,
    keys: Keys,
    clients: Arc<[String]>,
    left: Arc<AtomicUsize>,
    seed: u64,
) -> Vec<u32> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async move {
        let client = match contender {
            Contender::Naive { url, sha1 } => Client::Naive(
                redis::Client::open(url)
                    .expect("a url")
                    .get_multiplexed_async_connection()
                    .await
                    .expect("a connection"),
                sha1.into(),
            ),
            Contender::Redlimit { url, set, split } => {
                Client::Redlimit(redis_limiter(&url, "sat"), set, split)
            }
        };
        let mut tasks = Vec::new();
        for task in 0..IN_FLIGHT {
            let (client, keys, clients, left) = (
                client.clone(),
                keys.clone(),
                Arc::clone(&clients),
                Arc::clone(&left),
            );
            tasks.push(tokio::spawn(async move {
                let mut rng = Rng(seed ^ ((task as u64 + 1) * 0x9e37_79b9_7f4a_7c15));
                let mut latencies = Vec::new();
                // Bounded: each task stops when the run's count is used up.
                while left
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                    .is_ok()
                {
                    let who = &clients[keys.pick(rng.next())];
                    let started = Instant::now();
                    client.decide(who).await;
                    latencies
                        .push(u32::try_from(started.elapsed().as_micros()).unwrap_or(u32::MAX));
                }
                latencies
            }));
        }
        let mut latencies = Vec::new();
        for task in tasks {
            latencies.extend(task.await.expect("a task"));
        }
        latencies
    })
}

/// `decisions` checks of `contender` from [`THREADS`] client threads: each check's latency (µs),
/// and how long they took.
pub(crate) fn drive(
    contender: &Contender,
    keys: &Keys,
    clients: &Arc<[String]>,
    decisions: usize,
) -> (Vec<u32>, Duration) {
    let left = Arc::new(AtomicUsize::new(decisions));
    let started = Instant::now();
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let (contender, keys, clients, left) = (
                contender.clone(),
                keys.clone(),
                Arc::clone(clients),
                Arc::clone(&left),
            );
            std::thread::spawn(move || thread(contender, keys, clients, left, 0x5eed + t as u64))
        })
        .collect();
    let mut latencies: Vec<u32> = Vec::new();
    for thread in threads {
        latencies.extend(thread.join().expect("a client thread"));
    }
    (latencies, started.elapsed())
}

/// One contender on one key distribution: its row.
fn measure(
    name: &str,
    contender: &Contender,
    keys: &Keys,
    clients: &Arc<[String]>,
    decisions: usize,
    admin: &mut redis::Connection,
) -> Row {
    let (cpu, before) = (server_cpu(admin), script_calls(admin));
    let own = process_cpu();
    let (mut latencies, elapsed) = drive(contender, keys, clients, decisions);
    let own = own.zip(process_cpu()).map(|(before, after)| after - before);
    let (cpu, after) = (server_cpu(admin) - cpu, script_calls(admin));
    let (calls, usec) = (after.commands - before.commands, after.usec - before.usec);
    latencies.sort_unstable();
    let count = latencies.len() as f64;
    let percentile = |p: usize| latencies[(latencies.len() * p / 100).min(latencies.len() - 1)];
    Row {
        mode: "saturation",
        contender: name.to_owned(),
        decisions_per_sec: count / elapsed.as_secs_f64(),
        p50_us: percentile(50),
        p99_us: percentile(99),
        commands_per_decision: Some(calls as f64 / count),
        redis_us_per_decision: Some(cpu * 1e6 / count),
        bytes_per_key: None,
        // Rates well inside u64; the fraction is noise.
        #[allow(clippy::cast_possible_truncation)]
        extra: vec![
            (
                "decisions_per_redis_core_second",
                (count / cpu.max(1e-9)) as u64,
            ),
            ("script_ns_per_decision", (usec as f64 * 1e3 / count) as u64),
            // The clients' own CPU (the process's user + system time, 10 ms ticks).
            (
                "client_ns_per_decision",
                own.map_or(0, |own| (own.as_nanos() as f64 / count) as u64),
            ),
        ],
    }
}

/// How many rounds each contender runs: `--rounds`, as many as leave each round (N / rounds
/// decisions) 10,000 or more.
pub(crate) fn rounds(settings: &Settings) -> usize {
    let most = (settings.decisions / 10_000).max(1);
    settings.rounds.clamp(1, most)
}

/// One key distribution's figures: each contender's median row, and its rows by round.
pub(crate) struct Measured {
    pub(crate) rows: Vec<Row>,
    /// `rounds[c][r]`: contender `c`'s row of round `r`, contenders in the order of `rows`.
    rounds: Vec<Vec<Row>>,
}

impl Measured {
    /// Prints each contender's Redis CPU per decision over the naive script's in the same
    /// round, and each combined check's over its members' sum in the same round: the median
    /// and the range over the rounds. Paired by round, so that a machine that slows or speeds
    /// up between rounds moves both sides of a ratio alike; the table's ratios are of medians
    /// taken apart.
    pub(crate) fn print_paired(&self) {
        let cpu = |row: &Row| row.redis_us_per_decision.unwrap_or(f64::NAN);
        let at = |name: &str| self.rows.iter().position(|row| row.contender == name);
        let Some(naive) = at(NAIVE) else {
            return;
        };
        let rounds = self.rounds[naive].len();
        println!(
            "paired by round (Redis µs over the same round's; median, min–max of {rounds} rounds)"
        );
        for (row, by_round) in self.rows.iter().zip(&self.rounds) {
            if row.contender != NAIVE {
                let ratios = by_round
                    .iter()
                    .zip(&self.rounds[naive])
                    .map(|(row, base)| cpu(row) / cpu(base));
                println!("  {} × naive: {}", row.contender, spread(ratios));
            }
        }
        for Combined { name, members, .. } in COMBINED {
            let members: Option<Vec<usize>> = members.iter().map(|m| at(m.name())).collect();
            if let Some((combined, members)) = at(name).zip(members) {
                let ratios = (0..rounds).map(|r| {
                    let sum: f64 = members.iter().map(|&m| cpu(&self.rounds[m][r])).sum();
                    cpu(&self.rounds[combined][r]) / sum
                });
                println!("  {name} against its members' sum: {}", spread(ratios));
            }
        }
    }
}

/// The median of `ratios` and their range, as `median (min–max)`.
pub(crate) fn spread(ratios: impl Iterator<Item = f64>) -> String {
    let mut ratios: Vec<f64> = ratios.collect();
    ratios.sort_by(f64::total_cmp);
    match (ratios.first(), ratios.last()) {
        (Some(min), Some(max)) => {
            format!("{:.3} ({min:.3}–{max:.3})", ratios[ratios.len() / 2])
        }
        _ => "no rounds".to_owned(),
    }
}

/// The figures of both key distributions, each contender's rounds interleaved with the others'.
pub(crate) fn run(url: &str, settings: &Settings) -> (Measured, Measured) {
    let mut admin = admin(url);
    let naive_sha1: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(NAIVE_SCRIPT)
        .query(&mut admin)
        .expect("SCRIPT LOAD");
    let contenders: Vec<_> = contenders(url, &naive_sha1)
        .into_iter()
        .filter(|(name, _)| settings.keeps(name))
        .collect();
    let clients: Arc<[String]> = (0..settings.keys).map(|k| format!("client-{k}")).collect();
    let rounds = rounds(settings);
    let per_round = settings.decisions / rounds;
    let mut tables = Vec::new();
    for keys in [Keys::uniform(settings.keys), Keys::zipf(settings.keys)] {
        let mut rows: Vec<Vec<Row>> = vec![Vec::new(); contenders.len()];
        for round in 0..rounds {
            for at in crate::drive::round_order(round, contenders.len()) {
                let (name, contender) = &contenders[at];
                rows[at].push(measure(
                    name, contender, &keys, &clients, per_round, &mut admin,
                ));
            }
        }
        tables.push(Measured {
            rows: rows.iter().cloned().map(merge).collect(),
            rounds: rows,
        });
    }
    let zipf = tables.pop().expect("the Zipf table");
    let uniform = tables.pop().expect("the uniform table");
    (uniform, zipf)
}

/// The median of a contender's rounds, by Redis CPU per decision.
fn merge(mut rounds: Vec<Row>) -> Row {
    rounds.sort_by(|a, b| {
        a.redis_us_per_decision
            .partial_cmp(&b.redis_us_per_decision)
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    rounds.swap_remove(rounds.len() / 2)
}
