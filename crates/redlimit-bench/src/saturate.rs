//! Decisions per Redis core-second at saturation: `redis-benchmark` (64 connections, 16
//! commands in flight on each) sends each contender's script with `EVALSHA` until redis-server's
//! core is the limit, so what is measured is the script's server cost, not any client's. Besides
//! one check per call, redlimit's checks in batches of 64 as the backend sends them (an `FCALL` of
//! its function library's check), each policy as generous as the saturation mode's: a client
//! whose batches come slower than Redis decides them leaves Redis idle between calls, and Redis
//! then spends more on the same work (a batch's time inside the call doubled so here), so this is
//! Redis at work without pause, as it is under many application servers.

use std::{
    process::Command,
    time::{Duration, Instant},
};

use deadpool_redis::redis;
use redlimit::{Algorithm, KeyScheme, Policy, PolicySet};
use redlimit_tests::{command_calls, commands_sent};

use crate::{
    Settings,
    decisions::{NAIVE, NAIVE_SCRIPT, admin, policy, redis_limiter},
    report::Row,
    saturation::{COMBINED, Combined, generous, spread},
};

/// Checks per call of the batched contenders, as many as the backend puts in one.
const BATCH: usize = 64;

/// The program, from Debian's `redis-tools` (or any Redis install).
const REDIS_BENCHMARK: &str = "redis-benchmark";

/// One script and the `EVALSHA` arguments after its SHA-1, or (no script) redlimit's check
/// function and its `FCALL` arguments after its name, deciding `batch` checks a call;
/// `__rand_int__` in a key becomes one of the K clients (each one drawn apart).
struct Contender {
    name: String,
    script: Option<&'static str>,
    args: Vec<String>,
    batch: usize,
}

/// Whether `redis-benchmark` can be run.
pub(crate) fn available() -> bool {
    Command::new(REDIS_BENCHMARK)
        .arg("--version")
        .output()
        .is_ok_and(|out| out.status.success())
}

fn contenders() -> Vec<Contender> {
    let keys = KeyScheme::new("bench").expect("a valid prefix");
    let client = "client-__rand_int__";
    // The arguments redlimit sends for `policies` and `batch` clients at Redis TIME, after the
    // script's SHA-1 (or the function's name).
    let redlimit_of = |policies: &[Policy], batch: usize| -> Vec<String> {
        redlimit::check_command(&keys, policies, &vec![client; batch], "")
            .args_iter()
            .skip(2)
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => String::new(),
            })
            .collect()
    };
    let redlimit = |policies: &[Policy]| redlimit_of(policies, 1);
    // The naive script's window index from this process's clock, as its users compute it.
    let window = redlimit::Timestamp::now().as_micros() / 60_000_000;
    let mut all = vec![Contender {
        name: NAIVE.to_owned(),
        script: Some(NAIVE_SCRIPT),
        args: vec![
            "1".to_owned(),
            format!("naive:{{{client}}}:{window}"),
            "60".to_owned(),
        ],
        batch: 1,
    }];
    for algorithm in Algorithm::ALL {
        all.push(Contender {
            name: algorithm.name().to_owned(),
            script: Some(redlimit::script_of(&[policy(algorithm, 100)])),
            args: redlimit(&[policy(algorithm, 100)]),
            batch: 1,
        });
    }
    let per_hour = Policy::builder("per_hour", Algorithm::FixedWindow)
        .limit(1_000)
        .window(Duration::from_secs(3_600))
        .build()
        .expect("a valid policy");
    let two = [policy(Algorithm::FixedWindow, 100), per_hour];
    all.push(Contender {
        name: crate::decisions::TWO_POLICIES.to_owned(),
        script: Some(redlimit::script_of(&two)),
        args: redlimit(&two),
        batch: 1,
    });
    // Batches: each algorithm alone, and the sets weighed against their members (the second
    // key, where a set has one, is the client's too: a batch's keys are drawn at random alike).
    // Not the sets in a key group: redis-benchmark draws each `__rand_int__` apart, so the
    // group's policies, which name one key, would each name another client's, a group key each
    // at a group's dearer form (2.4 times their members' sum in one run, where the saturation
    // mode, whose checks name one key, reads 0.7-0.9).
    let batched = Algorithm::ALL
        .into_iter()
        .map(|algorithm| (algorithm.name(), vec![generous(algorithm)]))
        .chain(
            COMBINED
                .iter()
                .filter(|combined| combined.group.is_none())
                .map(|combined| (combined.name, combined.set().to_vec())),
        );
    for (name, policies) in batched {
        all.push(Contender {
            name: format!("{name} ×{BATCH}"),
            script: None,
            args: redlimit_of(&policies, BATCH),
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

/// Host and port of a `redis://host:port[/db]` URL.
fn host_port(url: &str) -> (String, String) {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, rest)| rest);
    let authority = rest.split('/').next().unwrap_or(rest);
    let (host, port) = authority.rsplit_once(':').unwrap_or((authority, "6379"));
    (host.to_owned(), port.to_owned())
}

/// Each contender's row (its Redis µs: the time inside its calls, per decision), and each
/// contender's Redis CPU per decision by round.
pub(crate) fn run(url: &str, settings: &Settings) -> (Vec<Row>, Vec<Vec<f64>>) {
    let mut admin = admin(url);
    let (host, port) = host_port(url);
    let contenders = contenders();
    let function = check_function(url, &mut admin);
    // What each contender's command begins with: EVALSHA and its script's SHA-1, or FCALL and
    // the check function.
    let calls: Vec<[String; 2]> = contenders
        .iter()
        .map(|contender| match contender.script {
            Some(script) => [
                "EVALSHA".to_owned(),
                redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(script)
                    .query(&mut admin)
                    .expect("SCRIPT LOAD"),
            ],
            None => ["FCALL".to_owned(), function.clone()],
        })
        .collect();
    let mut totals = vec![(0_u64, 0_u64, Duration::ZERO, 0.0_f64, 0_u64); contenders.len()];
    // Redis CPU (µs) per decision, by contender, then round.
    let mut by_round = vec![Vec::new(); contenders.len()];
    let per_round = (settings.decisions / settings.rounds).max(1_000);
    // A few interleaved rounds: drift on a shared machine touches every contender alike.
    for round in 0..settings.rounds.min(6) {
        for at in crate::drive::round_order(round, contenders.len()) {
            let contender = &contenders[at];
            let calls_made = (per_round / contender.batch).max(1);
            let before = command_calls(&mut admin);
            let cpu = server_cpu(&mut admin);
            let started = Instant::now();
            let status = Command::new(REDIS_BENCHMARK)
                .args(["-h", &host, "-p", &port, "-c", "64", "-P", "16", "-q"])
                .args(["-r", &settings.keys.to_string()])
                .args(["-n", &calls_made.to_string()])
                .args(&calls[at])
                .args(&contender.args)
                .stdout(std::process::Stdio::null())
                .status()
                .expect("redis-benchmark runs");
            assert!(status.success(), "redis-benchmark failed: {status}");
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
