//! Decisions per second and Redis µs per decision: the script a user writes by hand (the
//! baseline), redlimit's script on a raw connection, redlimit with each algorithm, and the
//! in-memory backend, interleaved round by round.

use redlimit::PolicySet;
use std::sync::Arc;

use deadpool_redis::redis::{self, aio::MultiplexedConnection};
use redlimit::{Algorithm, KeyScheme, Limiter, MemoryBackend, Policy, RedisBackend};

use crate::{
    Settings,
    drive::{self, Decide, Schedule, over_clients},
    report::Row,
};

/// The fixed window a user writes by hand: the window's index in the key (from the client's
/// clock), `INCR`, `EXPIRE` on the first hit, the count back; the caller compares it with the
/// limit. No Redis clock, nothing kept from the previous window.
pub(crate) const NAIVE_SCRIPT: &str = "local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('EXPIRE', KEYS[1], ARGV[1]) end
return n";

/// One way of deciding.
enum Contender {
    /// [`NAIVE_SCRIPT`] by `EVALSHA` on a plain multiplexed connection: the baseline.
    Naive {
        conn: MultiplexedConnection,
        sha1: String,
    },
    /// redlimit's script for one fixed window by `EVALSHA` on a plain multiplexed connection,
    /// no redlimit: what the library adds on the client side.
    Raw {
        conn: MultiplexedConnection,
        sha1: String,
        keys: KeyScheme,
        policy: [Policy; 1],
    },
    /// A redlimit limiter checking one policy.
    Limiter(Limiter, Policy),
    /// A redlimit limiter checking several policies together, all or nothing.
    Limiters(Limiter, Vec<Policy>),
}

impl Decide for Contender {
    async fn decide(&self, client: &str) {
        match self {
            Self::Naive { conn, sha1 } => {
                let count: u64 = redis::cmd("EVALSHA")
                    .arg(sha1)
                    .arg(1)
                    .arg(naive_key(client))
                    .arg(60)
                    .query_async(&mut conn.clone())
                    .await
                    .expect("naive EVALSHA");
                // The decision the hand-written limiter makes.
                std::hint::black_box(count <= 100);
            }
            Self::Raw {
                conn,
                sha1,
                keys,
                policy,
            } => {
                // What redlimit sends for a fixed window, under a prefix of its own.
                let reply: Vec<u8> = redlimit::check_command(keys, policy, &[client], sha1)
                    .query_async(&mut conn.clone())
                    .await
                    .expect("raw EVALSHA");
                // A MessagePack array of four integers.
                assert_eq!(reply.first(), Some(&0x94));
            }
            Self::Limiter(limiter, policy) => {
                limiter
                    .check(&PolicySet::from(policy.clone()), client)
                    .await
                    .map(|d| d[0].clone())
                    .expect("redlimit check");
            }
            Self::Limiters(limiter, policies) => {
                limiter
                    .check(
                        &PolicySet::new(policies.iter().cloned()).expect("a valid set"),
                        client,
                    )
                    .await
                    .expect("redlimit check of two policies");
            }
        }
    }
}

impl Contender {
    fn key(&self, client: &str) -> String {
        match self {
            Self::Naive { .. } => naive_key(client),
            Self::Raw { .. } => format!("raw:fixed_window:{{{client}}}:fw:60000:100"),
            Self::Limiter(limiter, policy) => limiter.keys().key(policy, client),
            Self::Limiters(limiter, policies) => limiter.keys().key(&policies[0], client),
        }
    }
}

/// `naive:{client}:window`, the window's index from this process's clock.
pub(crate) fn naive_key(client: &str) -> String {
    let window = redlimit::Timestamp::now().as_micros() / 60_000_000;
    format!("naive:{{{client}}}:{window}")
}

pub(crate) fn policy(algorithm: Algorithm, limit: u64) -> Policy {
    Policy::builder(algorithm.name(), algorithm)
        .limit(limit)
        .window(std::time::Duration::from_secs(60))
        .build()
        .expect("a valid policy")
}

pub(crate) fn redis_limiter(url: &str, prefix: &str) -> Limiter {
    // Long enough for a redis-server run under callgrind on a loaded machine (`--mode
    // instructions`, some 50 times slower): a check that ran out of it would end the run.
    let backend = RedisBackend::builder(url)
        .budget(std::time::Duration::from_secs(30))
        .build()
        .expect("a valid url");
    Limiter::with_prefix(backend, prefix).expect("a valid prefix")
}

pub(crate) fn admin(url: &str) -> redis::Connection {
    redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .expect("an admin connection")
}

/// Average `MEMORY USAGE` of up to 200 keys.
pub(crate) fn bytes_per_key(
    admin: &mut redis::Connection,
    keys: impl Iterator<Item = String>,
) -> Option<f64> {
    let sizes: Vec<u64> = keys
        .take(200)
        .filter_map(|key| {
            redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(key)
                .arg("SAMPLES")
                .arg(0)
                .query::<Option<u64>>(admin)
                .ok()
                .flatten()
        })
        .collect();
    (!sizes.is_empty()).then(|| sizes.iter().sum::<u64>() as f64 / sizes.len() as f64)
}

/// The baseline's name.
pub(crate) const NAIVE: &str = "naive_script";
/// A fixed window of 100 per minute and one of 1 000 per hour checked together.
pub(crate) const TWO_POLICIES: &str = "fixed_window+per_hour";

pub(crate) async fn run(url: &str, settings: &Settings) -> Vec<Row> {
    let mut admin = admin(url);
    let client = redis::Client::open(url).expect("a valid url");
    let conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("a raw connection");
    let load = |admin: &mut redis::Connection, script: &str| -> String {
        redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(script)
            .query(admin)
            .expect("SCRIPT LOAD")
    };
    let naive = Contender::Naive {
        conn: conn.clone(),
        sha1: load(&mut admin, NAIVE_SCRIPT),
    };
    let raw = Contender::Raw {
        conn,
        sha1: load(
            &mut admin,
            redlimit::script_of(&[policy(Algorithm::FixedWindow, 100)]),
        ),
        keys: KeyScheme::new("raw").expect("a valid prefix"),
        policy: [policy(Algorithm::FixedWindow, 100)],
    };
    let mut contenders: Vec<(String, Arc<Contender>)> = vec![
        (NAIVE.to_owned(), Arc::new(naive)),
        ("raw_script".to_owned(), Arc::new(raw)),
    ];
    for algorithm in Algorithm::ALL {
        let limiter = redis_limiter(url, "bench");
        contenders.push((
            algorithm.name().to_owned(),
            Arc::new(Contender::Limiter(limiter, policy(algorithm, 100))),
        ));
    }
    // The common pairing of a short and a long window, in one check.
    let per_hour = Policy::builder("per_hour", Algorithm::FixedWindow)
        .limit(1_000)
        .window(std::time::Duration::from_secs(3_600))
        .build()
        .expect("a valid policy");
    contenders.push((
        TWO_POLICIES.to_owned(),
        Arc::new(Contender::Limiters(
            redis_limiter(url, "bench"),
            vec![policy(Algorithm::FixedWindow, 100), per_hour],
        )),
    ));
    contenders.push((
        "memory".to_owned(),
        Arc::new(Contender::Limiter(
            Limiter::new(MemoryBackend::default()),
            policy(Algorithm::FixedWindow, 100),
        )),
    ));
    let tallies = over_clients(&contenders, settings, &mut admin).await;
    contenders
        .iter()
        .zip(tallies)
        .map(|((name, contender), tally)| {
            let on_redis = name != "memory";
            let bytes = on_redis
                .then(|| {
                    let keys = Schedule::new(settings)
                        .last_round_keys()
                        .map(|k| contender.key(&drive::client(k)));
                    bytes_per_key(&mut admin, keys)
                })
                .flatten();
            tally.row("decisions", name, on_redis, bytes)
        })
        .collect()
}
