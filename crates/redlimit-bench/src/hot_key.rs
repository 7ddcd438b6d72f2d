//! `--mode hot-key`: one key, as fast as the bench can drive it from four processes (each a copy
//! of this binary run as `hot-key-worker`), checked exactly against hot-key mode (grants), rounds
//! interleaved. Each round a fresh key whose limit is half the round's decisions, so that it is
//! reached: the figures cover both the admitted half and the denied one, and what was admitted
//! is printed beside the limit and the documented bound.

use std::{
    process::{Command, ExitCode, Stdio},
    time::{Duration, Instant},
};

use redlimit::{Algorithm, Grants, GuardedLimiter, Limiter, Policy, RedisBackend};
use redlimit_tests::{hammer_one_key, script_calls};

use crate::{
    Settings, decisions::admin, process_cpu::process_cpu, report::Row, saturate::server_cpu,
};

/// The worker's name on the command line.
pub(crate) const WORKER: &str = "hot-key-worker";
/// How many processes share the key.
const PROCESSES: u64 = 4;
/// Hot-key mode's grants: at most this many units, living this long.
const GRANT: u64 = 1_000;
const LIFE: Duration = Duration::from_millis(500);
/// The key's window: longer than any run, so the limit is what passes.
const WINDOW: Duration = Duration::from_secs(3_600);

/// The contenders: a name, its algorithm and whether it takes grants.
const CONTENDERS: [(&str, Algorithm, bool); 4] = [
    (
        "fixed_window_anchored",
        Algorithm::FixedWindowAnchored,
        false,
    ),
    (
        "fixed_window_anchored+grants",
        Algorithm::FixedWindowAnchored,
        true,
    ),
    ("gcra", Algorithm::Gcra, false),
    ("gcra+grants", Algorithm::Gcra, true),
];

fn policy(algorithm: Algorithm, limit: u64, grants: bool) -> Policy {
    let builder = Policy::builder("hot", algorithm)
        .limit(limit)
        .window(WINDOW);
    let builder = if grants {
        builder.grants(Grants::up_to(GRANT).life(LIFE))
    } else {
        builder
    };
    builder.build().expect("a valid policy")
}

/// The worker: `URL PREFIX CONTENDER LIMIT CHECKS AT_ONCE`; prints what it admitted, what it
/// denied and its own CPU time (ns).
pub(crate) fn worker(args: &[String]) -> ExitCode {
    let [url, prefix, name, numbers @ ..] = args else {
        eprintln!("usage: redlimit-bench {WORKER} URL PREFIX CONTENDER LIMIT CHECKS AT_ONCE");
        return ExitCode::from(2);
    };
    let numbers: Option<Vec<u64>> = numbers.iter().map(|n| n.parse().ok()).collect();
    let contender = CONTENDERS.iter().find(|(n, ..)| n == name);
    let (Some(&[limit, checks, at_once]), Some(&(_, algorithm, grants))) =
        (numbers.as_deref(), contender)
    else {
        // Not the arguments themselves: the URL may hold a password.
        eprintln!(
            "redlimit-bench {WORKER}: {name:?} is no contender, or the three counts are not numbers"
        );
        return ExitCode::from(2);
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let (admitted, denied) = runtime.block_on(async {
        let backend = RedisBackend::builder(url.as_str())
            .budget(Duration::from_secs(30))
            .build()
            .expect("a valid url");
        let limiter = Limiter::with_prefix(backend, prefix).expect("a valid prefix");
        let guard = GuardedLimiter::builder(limiter, policy(algorithm, limit, grants))
            .budget(Duration::from_secs(30))
            .build();
        hammer_one_key(&guard, checks, at_once).await
    });
    let cpu = process_cpu().map_or(0, |cpu| cpu.as_nanos());
    println!("{admitted} {denied} {cpu}");
    ExitCode::SUCCESS
}

/// One round of the `at`th contender: four workers on a fresh key of limit `decisions / 2`.
fn measure(at: usize, round: usize, settings: &Settings, url: &str) -> Row {
    let name = CONTENDERS[at].0;
    let mut admin = admin(url);
    let decisions = settings.decisions as u64;
    let limit = decisions / 2;
    let prefix = format!("hot-{round}-{at}");
    let (cpu, calls) = (server_cpu(&mut admin), script_calls(&mut admin).commands);
    let this = std::env::current_exe().expect("the bench's own path");
    let started = Instant::now();
    let workers: Vec<_> = (0..PROCESSES)
        .map(|_| {
            Command::new(&this)
                .args([WORKER, url, &prefix, name])
                .args(
                    [limit, decisions / PROCESSES, settings.concurrency as u64]
                        .map(|n| n.to_string()),
                )
                .stdout(Stdio::piped())
                .spawn()
                .expect("a worker starts")
        })
        .collect();
    let (mut admitted, mut decided, mut client_ns) = (0, 0, 0);
    for worker in workers {
        let output = worker.wait_with_output().expect("a worker ends");
        let text = String::from_utf8_lossy(&output.stdout);
        let counts: Vec<u64> = text
            .split_whitespace()
            .filter_map(|n| n.parse().ok())
            .collect();
        let &[yes, no, ns] = &counts[..] else {
            panic!("a worker ({:?}) printed {text:?}", output.status);
        };
        (admitted, decided, client_ns) = (admitted + yes, decided + yes + no, client_ns + ns);
    }
    let elapsed = started.elapsed();
    let cpu = server_cpu(&mut admin) - cpu;
    let calls = script_calls(&mut admin).commands - calls;
    let count = decided.max(1) as f64;
    let grants = name.ends_with("+grants");
    // Exact GCRA admits its burst (the limit) and what refills during the run; a fixed window,
    // its limit. Grants add at most the units held when a window begins (none for the fixed
    // windows, whose grants end with theirs).
    let refill = if name.starts_with("gcra") {
        let refill = (u128::from(limit) * elapsed.as_millis()).div_ceil(WINDOW.as_millis());
        u64::try_from(refill).unwrap_or(u64::MAX)
    } else {
        0
    };
    let bound = if grants && name.starts_with("gcra") {
        PROCESSES * GRANT
    } else {
        0
    };
    Row {
        mode: "hot-key",
        contender: name.to_owned(),
        decisions_per_sec: count / elapsed.as_secs_f64(),
        p50_us: 0,
        p99_us: 0,
        commands_per_decision: Some(calls as f64 / count),
        redis_us_per_decision: Some(cpu * 1e6 / count),
        bytes_per_key: None,
        // Counts well inside u64; the fraction is noise.
        #[allow(clippy::cast_possible_truncation)]
        extra: vec![
            ("admitted", admitted),
            ("script_calls", calls),
            ("limit", limit + refill),
            ("bound", bound),
            ("client_ns_per_decision", (client_ns as f64 / count) as u64),
        ],
    }
}

/// Every contender's median round (by decisions per second), rounds interleaved.
pub(crate) fn run(url: &str, settings: &Settings) -> Vec<Row> {
    let rounds = settings.rounds;
    let mut rows: Vec<Vec<Row>> = vec![Vec::new(); CONTENDERS.len()];
    for round in 0..rounds {
        for at in crate::drive::round_order(round, CONTENDERS.len()) {
            rows[at].push(measure(at, round, settings, url));
        }
    }
    rows.into_iter()
        .map(|mut rounds| {
            let over = rounds.iter().filter(|row| {
                figure(row, "admitted") > figure(row, "limit") + figure(row, "bound")
            });
            let over = over.count() as u64;
            rounds.sort_by(|a, b| a.decisions_per_sec.total_cmp(&b.decisions_per_sec));
            let mut median = rounds.swap_remove(rounds.len() / 2);
            median.extra.push(("rounds_over_bound", over));
            median
        })
        .collect()
}

fn figure(row: &Row, name: &str) -> u64 {
    row.extra
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(0, |(_, v)| *v)
}
