//! One instance of a service hammering one hot key through a guard in hot-key mode: run as
//! several processes by the suite's `grants` tests. Arguments: the Redis URL, the key prefix,
//! the limit (an hour from the first request, grants of up to 200 living 250 ms), how many
//! checks to make, how many at once. Prints `admitted denied` when done.

use std::{env, process::ExitCode, time::Duration};

use redlimit::{Algorithm, Grants, GuardedLimiter, Limiter, Policy, RedisBackend};
use redlimit_tests::hammer_one_key;

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    let [url, prefix, numbers @ ..] = &args[..] else {
        eprintln!("usage: hot_key_worker REDIS_URL PREFIX LIMIT CHECKS AT_ONCE");
        return ExitCode::FAILURE;
    };
    let numbers: Option<Vec<u64>> = numbers.iter().map(|n| n.parse().ok()).collect();
    let Some(&[limit, checks, at_once]) = numbers.as_deref() else {
        eprintln!("LIMIT, CHECKS and AT_ONCE are counts");
        return ExitCode::FAILURE;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let (admitted, denied) = runtime.block_on(run(url, prefix, limit, checks, at_once));
    println!("{admitted} {denied}");
    ExitCode::SUCCESS
}

async fn run(url: &str, prefix: &str, limit: u64, checks: u64, at_once: u64) -> (u64, u64) {
    let backend = RedisBackend::builder(url)
        .budget(Duration::from_secs(30))
        .build()
        .expect("a valid url");
    let limiter = Limiter::with_prefix(backend, prefix).expect("a valid prefix");
    let policy = Policy::builder("hot", Algorithm::FixedWindowAnchored)
        .limit(limit)
        .window(Duration::from_secs(3_600))
        .grants(Grants::up_to(200).life(Duration::from_millis(250)))
        .build()
        .expect("a valid policy");
    let guard = GuardedLimiter::builder(limiter, policy)
        .budget(Duration::from_secs(30))
        .build();
    hammer_one_key(&guard, checks, at_once).await
}
