//! Decisions per Redis core-second at saturation: `redis-benchmark` (64 connections, 16
//! commands in flight on each) sends each contender's script with `EVALSHA` until redis-server's
//! core is the limit, so what is measured is the script's server cost, not any client's.

use std::{
    process::Command,
    time::{Duration, Instant},
};

use deadpool_redis::redis;
use redlimit::{Algorithm, KeyScheme, Policy};
use redlimit_tests::{command_calls, commands_sent};

use crate::{
    Settings,
    decisions::{NAIVE, NAIVE_SCRIPT, admin, policy},
    report::Row,
};

/// The program, from Debian's `redis-tools` (or any Redis install).
const REDIS_BENCHMARK: &str = "redis-benchmark";

/// One script and the `EVALSHA` arguments after its SHA-1; `__rand_int__` in a key becomes one
/// of the K clients.
struct Contender {
    name: String,
    script: &'static str,
    args: Vec<String>,
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
    // The arguments redlimit sends for `policies` at Redis TIME, after the script's SHA-1.
    let redlimit = |policies: &[Policy]| -> Vec<String> {
        redlimit::check_command(&keys, policies, client, "")
            .args_iter()
            .skip(2)
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => String::new(),
            })
            .collect()
    };
    // The naive script's window index from this process's clock, as its users compute it.
    let window = redlimit::Timestamp::now().as_micros() / 60_000_000;
    let mut all = vec![Contender {
        name: NAIVE.to_owned(),
        script: NAIVE_SCRIPT,
        args: vec![
            "1".to_owned(),
            format!("naive:{{{client}}}:{window}"),
            "60".to_owned(),
        ],
    }];
    for algorithm in Algorithm::ALL {
        all.push(Contender {
            name: algorithm.name().to_owned(),
            script: redlimit::script_of(&[policy(algorithm, 100)]),
            args: redlimit(&[policy(algorithm, 100)]),
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
        script: redlimit::script_of(&two),
        args: redlimit(&two),
    });
    all
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

pub(crate) fn run(url: &str, settings: &Settings) -> Vec<Row> {
    let mut admin = admin(url);
    let (host, port) = host_port(url);
    let contenders = contenders();
    let sha1s: Vec<String> = contenders
        .iter()
        .map(|contender| {
            redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(contender.script)
                .query(&mut admin)
                .expect("SCRIPT LOAD")
        })
        .collect();
    let mut totals = vec![(0_u64, 0_u64, Duration::ZERO, 0.0_f64, 0_u64); contenders.len()];
    let per_round = (settings.decisions / settings.rounds).max(1_000);
    // A few interleaved rounds: drift on a shared machine touches every contender alike.
    for round in 0..settings.rounds.min(6) {
        for at in crate::drive::round_order(round, contenders.len()) {
            let contender = &contenders[at];
            let before = command_calls(&mut admin);
            let cpu = server_cpu(&mut admin);
            let started = Instant::now();
            let status = Command::new(REDIS_BENCHMARK)
                .args(["-h", &host, "-p", &port, "-c", "64", "-P", "16", "-q"])
                .args(["-r", &settings.keys.to_string()])
                .args(["-n", &per_round.to_string()])
                .args(["EVALSHA", &sha1s[at]])
                .args(&contender.args)
                .stdout(std::process::Stdio::null())
                .status()
                .expect("redis-benchmark runs");
            assert!(status.success(), "redis-benchmark failed: {status}");
            let elapsed = started.elapsed();
            let cpu = server_cpu(&mut admin) - cpu;
            let sent = commands_sent(&before, &command_calls(&mut admin));
            let total = &mut totals[at];
            total.0 += per_round as u64;
            total.1 += sent.commands;
            total.2 += elapsed;
            total.3 += cpu;
            total.4 += sent.usec;
        }
    }
    contenders
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
        .collect()
}
