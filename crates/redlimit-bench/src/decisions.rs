//! Decisions per second: a raw redis-rs baseline, redlimit with each algorithm, and the
//! in-memory backend, interleaved round by round.

use std::sync::Arc;

use deadpool_redis::redis::{self, aio::MultiplexedConnection};
use redlimit::{Algorithm, Limiter, MemoryBackend, Policy, RedisBackend};

use crate::{
    Settings,
    drive::{Schedule, interleaved},
    report::Row,
};

/// One way of deciding.
enum Contender {
    /// The check script by `EVALSHA` on a plain multiplexed connection, no redlimit.
    Raw {
        conn: MultiplexedConnection,
        sha1: String,
    },
    /// A redlimit limiter.
    Limiter(Limiter, Policy),
}

impl Contender {
    async fn decide(&self, client: &str) {
        match self {
            Self::Raw { conn, sha1 } => {
                // The same key shape and arguments redlimit sends for a fixed window.
                let key = format!("raw:fixed_window:{{{client}}}:fw:60000:100");
                let reply: Vec<i64> = redis::cmd("EVALSHA")
                    .arg(sha1)
                    .arg(1)
                    .arg(key)
                    .arg("")
                    .arg(1)
                    .arg("fw")
                    .arg(100)
                    .arg(60_000)
                    .arg(100)
                    .query_async(&mut conn.clone())
                    .await
                    .expect("raw EVALSHA");
                assert_eq!(reply.len(), 4);
            }
            Self::Limiter(limiter, policy) => {
                limiter
                    .check(policy, client, 1)
                    .await
                    .expect("redlimit check");
            }
        }
    }

    fn key(&self, client: &str) -> String {
        match self {
            Self::Raw { .. } => format!("raw:fixed_window:{{{client}}}:fw:60000:100"),
            Self::Limiter(limiter, policy) => limiter.keys().key(policy, client),
        }
    }
}

pub(crate) fn policy(algorithm: Algorithm, limit: u64) -> Policy {
    Policy::builder(algorithm.name(), algorithm)
        .limit(limit)
        .window(std::time::Duration::from_secs(60))
        .build()
        .expect("a valid policy")
}

pub(crate) fn redis_limiter(url: &str, prefix: &str) -> Limiter {
    let backend = RedisBackend::builder(url)
        .budget(std::time::Duration::from_secs(2))
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

pub(crate) async fn run(url: &str, settings: &Settings) -> Vec<Row> {
    let mut admin = admin(url);
    let client = redis::Client::open(url).expect("a valid url");
    let conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("a raw connection");
    let sha1: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(redlimit::SCRIPT)
        .query(&mut admin)
        .expect("SCRIPT LOAD");
    let mut contenders: Vec<(String, Arc<Contender>)> = vec![(
        "raw_baseline".to_owned(),
        Arc::new(Contender::Raw { conn, sha1 }),
    )];
    for algorithm in Algorithm::ALL {
        let limiter = redis_limiter(url, "bench");
        contenders.push((
            algorithm.name().to_owned(),
            Arc::new(Contender::Limiter(limiter, policy(algorithm, 100))),
        ));
    }
    contenders.push((
        "memory".to_owned(),
        Arc::new(Contender::Limiter(
            Limiter::new(MemoryBackend::default()),
            policy(Algorithm::FixedWindow, 100),
        )),
    ));
    let clients: Arc<[String]> = (0..settings.keys).map(|k| format!("client-{k}")).collect();
    let tallies = interleaved(&contenders, settings, &mut admin, |(_, contender)| {
        let (contender, clients) = (Arc::clone(contender), Arc::clone(&clients));
        move |key: usize| {
            let (contender, clients) = (Arc::clone(&contender), Arc::clone(&clients));
            async move { contender.decide(&clients[key]).await }
        }
    })
    .await;
    contenders
        .iter()
        .zip(tallies)
        .map(|((name, contender), tally)| {
            let on_redis = name != "memory";
            let bytes = on_redis
                .then(|| {
                    let keys = Schedule::new(settings)
                        .last_round_keys()
                        .map(|k| contender.key(&clients[k]));
                    bytes_per_key(&mut admin, keys)
                })
                .flatten();
            tally.row("decisions", name, on_redis, bytes)
        })
        .collect()
}
