//! Decisions per Redis core-second at saturation: 64 connections with 16 commands in flight on
//! each, as `redis-benchmark -c 64 -P 16` sends them (the pipeline module), send each
//! contender's script with `EVALSHA` until redis-server's core is the limit, so what is measured
//! is the script's server cost, not any client's. Besides one check per call, redlimit's checks
//! in batches of 64 as the backend sends them (an `FCALL` of its function library's check), each
//! policy as generous as the saturation mode's: a client whose batches come slower than Redis
//! decides them leaves Redis idle between calls, and Redis then spends more on the same work (a
//! batch's time inside the call doubled so here), so this is Redis at work without pause, as it
//! is under many application servers.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use deadpool_redis::redis;
use redlimit::{Algorithm, KeyScheme, Policy, PolicySet};
use redlimit_tests::{command_calls, commands_sent};

use crate::{
    Settings,
    decisions::{NAIVE, NAIVE_SCRIPT, admin, policy, redis_limiter},
    pipeline,
    report::Row,
    saturation::{COMBINED, Combined, Keys, Rng, generous, spread},
};

/// Checks per call of the batched contenders, as many as the backend puts in one.
const BATCH: usize = 64;

/// Distinct commands built for a contender, at most: sent in turn, their clients drawn at
/// random over the keys.
const POOL: usize = 20_000;

/// One script (the naive one where there are no policies, else redlimit's of `policies`) sent
/// by `EVALSHA`, or (no script) redlimit's check function by `FCALL`, deciding `batch` checks
/// of `policies` a call.
struct Contender {
    name: String,
    script: Option<&'static str>,
    policies: Option<Vec<Policy>>,
    batch: usize,
}

impl Contender {
    /// `size` of its commands, each beginning with `head` (the command and the script's SHA-1 or
    /// the function's name), its clients drawn uniformly from `keys`, its keys under a prefix of
    /// contender `at`'s own, for no contender to find another's state (a key group holding
    /// records of another set's policies is read the slow way).
    fn pool(&self, head: &[String; 2], at: usize, keys: usize, size: usize) -> Arc<[Vec<u8>]> {
        let prefix = format!("bench{at}");
        let scheme = KeyScheme::new(prefix.as_str()).expect("a valid prefix");
        let clients = Keys::uniform(keys);
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (at as u64 + 1));
        // The naive script's window index from this process's clock, as its users compute it.
        let window = redlimit::Timestamp::now().as_micros() / 60_000_000;
        (0..size)
            .map(|_| {
                let drawn: Vec<String> = (0..self.batch)
                    .map(|_| format!("client-{}", clients.pick(rng.next())))
                    .collect();
                let mut command = redis::cmd(&head[0]);
                command.arg(&head[1]);
                match &self.policies {
                    None => {
                        command
                            .arg(1)
                            .arg(format!("{prefix}:{{{}}}:{window}", drawn[0]))
                            .arg(60);
                    }
                    Some(policies) => {
                        let drawn: Vec<&str> = drawn.iter().map(String::as_str).collect();
                        // redlimit's arguments at Redis TIME, after the script's SHA-1.
                        for arg in redlimit::check_command(&scheme, policies, &drawn, "")
                            .args_iter()
                            .skip(2)
                        {
                            if let redis::Arg::Simple(bytes) = arg {
                                command.arg(bytes);
                            }
                        }
                    }
                }
                command.get_packed_command()
            })
            .collect()
    }
}

fn contenders() -> Vec<Contender> {
    let mut all = vec![Contender {
        name: NAIVE.to_owned(),
        script: Some(NAIVE_SCRIPT),
        policies: None,
        batch: 1,
    }];
    for algorithm in Algorithm::ALL {
        all.push(Contender {
            name: algorithm.name().to_owned(),
            script: Some(redlimit::script_of(&[policy(algorithm, 100)])),
            policies: Some(vec![policy(algorithm, 100)]),
            batch: 1,
        });
    }
    let per_hour = Policy::builder("per_hour", Algorithm::FixedWindow)
        .limit(1_000)
        .window(Duration::from_secs(3_600))
        .build()
        .expect("a valid policy");
    let two = vec![policy(Algorithm::FixedWindow, 100), per_hour];
    all.push(Contender {
        name: crate::decisions::TWO_POLICIES.to_owned(),
        script: Some(redlimit::script_of(&two)),
        policies: Some(two),
        batch: 1,
    });
    // Batches: each algorithm alone, and the sets weighed against their members (the second
    // key, where a set has one, is the client's too: a batch's keys are drawn at random alike).
    let batched = Algorithm::ALL
        .into_iter()
        .map(|algorithm| (algorithm.name(), vec![generous(algorithm)]))
        .chain(
            COMBINED
                .iter()
                .map(|combined| (combined.name, combined.set().to_vec())),
        );
    for (name, policies) in batched {
        all.push(Contender {
            name: format!("{name} ×{BATCH}"),
            script: None,
            policies: Some(policies),
            batch: BATCH,
        });
    }
    all
}

/// The name of the check function of redlimit's library, loaded by a first check through a
/// limiter on `url`: the server must hold no other version's (`FUNCTION DELETE` them).
fn check_function(url: &str, admin: &mut redis::Connection) -> String {
    let limiter = redis_limiter(url, "saturate");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    // Two policies: a check through the library's general entry, which loads it.
    let set = PolicySet::new([generous(Algorithm::FixedWindow), generous(Algorithm::Gcra)])
        .expect("a valid set");
    runtime
        .block_on(async { limiter.check(&set, "warm").await })
        .expect("a check loads the library");
    let listed: redis::Value = redis::cmd("FUNCTION")
        .arg("LIST")
        .arg("LIBRARYNAME")
        .arg("redlimit_*")
        .query(admin)
        .expect("FUNCTION LIST");
    let mut names = Vec::new();
    library_names(&listed, &mut names);
    match names.as_slice() {
        [name] => format!("{name}_check"),
        _ => panic!(
            "saturate: {} redlimit libraries on the server ({names:?}); delete all but this version's",
            names.len()
        ),
    }
}

/// The values that follow `library_name` anywhere in a `FUNCTION LIST` reply.
fn library_names(value: &redis::Value, names: &mut Vec<String>) {
    if let redis::Value::Array(items) = value {
        for pair in items.windows(2) {
            if let [
                redis::Value::BulkString(field),
                redis::Value::BulkString(name),
            ] = pair
                && field.as_slice() == b"library_name"
            {
                names.push(String::from_utf8_lossy(name).into_owned());
            }
        }
        for item in items {
            library_names(item, names);
        }
    }
}

/// The server's own CPU seconds so far (`INFO cpu`: user and system, every thread).
pub(crate) fn server_cpu(admin: &mut redis::Connection) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query(admin)
        .expect("INFO cpu");
    info.lines()
        .filter_map(|line| line.split_once(':'))
        .filter(|(name, _)| matches!(*name, "used_cpu_user" | "used_cpu_sys"))
        .filter_map(|(_, value)| value.trim().parse::<f64>().ok())
        .sum()
}

/// `host:port` of a `redis://host:port[/db]` URL.
fn host_port(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, rest)| rest);
    let authority = rest.split('/').next().unwrap_or(rest);
    let (host, port) = authority.rsplit_once(':').unwrap_or((authority, "6379"));
    format!("{host}:{port}")
}

/// Each contender's row (its Redis µs: the time inside its calls, per decision), and each
/// contender's Redis CPU per decision by round.
pub(crate) fn run(url: &str, settings: &Settings) -> (Vec<Row>, Vec<Vec<f64>>) {
    let mut admin = admin(url);
    let addr = host_port(url);
    let contenders: Vec<_> = contenders()
        .into_iter()
        .filter(|contender| settings.keeps(contender.name.trim_end_matches(&format!(" ×{BATCH}"))))
        .collect();
    let function = check_function(url, &mut admin);
    let per_round = (settings.decisions / settings.rounds).max(1_000);
    // What each contender's commands begin with (EVALSHA and its script's SHA-1, or FCALL and
    // the check function), and the commands, built before any is timed.
    let pools: Vec<Arc<[Vec<u8>]>> = contenders
        .iter()
        .enumerate()
        .map(|(at, contender)| {
            let head = match contender.script {
                Some(script) => [
                    "EVALSHA".to_owned(),
                    redis::cmd("SCRIPT")
                        .arg("LOAD")
                        .arg(script)
                        .query(&mut admin)
                        .expect("SCRIPT LOAD"),
                ],
                None => ["FCALL".to_owned(), function.clone()],
            };
            let size = (per_round / contender.batch).clamp(1, POOL);
            contender.pool(&head, at, settings.keys, size)
        })
        .collect();
    let mut totals = vec![(0_u64, 0_u64, Duration::ZERO, 0.0_f64, 0_u64); contenders.len()];
    // Redis CPU (µs) per decision, by contender, then round.
    let mut by_round = vec![Vec::new(); contenders.len()];
    // A few interleaved rounds: drift on a shared machine touches every contender alike.
    for round in 0..settings.rounds.min(6) {
        for at in crate::drive::round_order(round, contenders.len()) {
            let contender = &contenders[at];
            let calls_made = (per_round / contender.batch).max(1);
            let before = command_calls(&mut admin);
            let cpu = server_cpu(&mut admin);
            let started = Instant::now();
            pipeline::send(&addr, &pools[at], calls_made);
            let elapsed = started.elapsed();
            let cpu = server_cpu(&mut admin) - cpu;
            let sent = commands_sent(&before, &command_calls(&mut admin));
            let decided = (calls_made * contender.batch) as u64;
            by_round[at].push(cpu * 1e6 / decided as f64);
            let total = &mut totals[at];
            total.0 += decided;
            total.1 += sent.commands;
            total.2 += elapsed;
            total.3 += cpu;
            total.4 += sent.usec;
        }
    }
    let rows = contenders
        .iter()
        .zip(totals)
        .map(|(contender, (decisions, commands, elapsed, cpu, usec))| {
            let count = decisions as f64;
            Row {
                mode: "saturate",
                contender: contender.name.clone(),
                decisions_per_sec: count / elapsed.as_secs_f64().max(1e-9),
                p50_us: 0,
                p99_us: 0,
                commands_per_decision: Some(commands as f64 / count.max(1.0)),
                redis_us_per_decision: Some(usec as f64 / count.max(1.0)),
                bytes_per_key: None,
                extra: vec![(
                    "decisions_per_redis_core_second",
                    // A rate well inside u64; the fraction is noise.
                    #[allow(clippy::cast_possible_truncation)]
                    {
                        (count / cpu.max(1e-9)) as u64
                    },
                )],
            }
        })
        .collect();
    (rows, by_round)
}

/// Prints each batched contender's Redis CPU per decision over the naive script's in the same
/// round, and each set's over the sum of its members' (batched alike) in the same round: the
/// median and the range over the rounds.
pub(crate) fn print_paired(rows: &[Row], by_round: &[Vec<f64>]) {
    let at = |name: &str| rows.iter().position(|row| row.contender == name);
    let Some(naive) = at(NAIVE) else {
        return;
    };
    println!(
        "paired by round (Redis CPU per decision over the same round's; median, min–max of {} rounds)",
        by_round[naive].len()
    );
    for (row, cpu) in rows.iter().zip(by_round) {
        if row.contender.ends_with(&format!(" ×{BATCH}")) {
            let ratios = cpu
                .iter()
                .zip(&by_round[naive])
                .map(|(cpu, base)| cpu / base);
            println!("  {} × naive: {}", row.contender, spread(ratios));
        }
    }
    let batched = |name: &str| at(&format!("{name} ×{BATCH}"));
    for Combined { name, members, .. } in COMBINED {
        let members: Option<Vec<usize>> = members.iter().map(|m| batched(m.name())).collect();
        if let Some((set, members)) = batched(name).zip(members) {
            let ratios = by_round[set]
                .iter()
                .enumerate()
                .map(|(round, cpu)| cpu / members.iter().map(|&m| by_round[m][round]).sum::<f64>());
            println!(
                "  {name} ×{BATCH} against its members' sum: {}",
                spread(ratios)
            );
        }
    }
}
