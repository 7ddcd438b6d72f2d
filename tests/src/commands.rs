//! Counting the commands clients send, from `INFO commandstats`.

use std::collections::HashMap;

use deadpool_redis::redis;

/// Commands the scripts and functions (redlimit's, and the benchmark's naive one) run inside
/// `EVALSHA` or `FCALL`: Redis counts them in `commandstats` too, but they cost no round trip.
const INSIDE_SCRIPTS: &[&str] = &[
    "time",
    "incr",
    "expire",
    "hmget",
    "hset",
    "hincrby",
    "pexpire",
    "get",
    "set",
    "setrange",
    "incrby",
    "decrby",
    "zremrangebyscore",
    "zcard",
    "zrange",
    "zcount",
    "zadd",
];

/// Inspection commands of tests and benchmarks themselves.
const INSPECTION: &[&str] = &[
    "info",
    "config|resetstat",
    "memory|usage",
    "dbsize",
    "flushall",
];

/// The operator-event listener's upkeep: its subscription, and a `PING` per second it hears
/// nothing. Sent by no request.
const UPKEEP: &[&str] = &["subscribe", "ping"];

/// One command's figures so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommandStat {
    /// Calls, rejected and failed ones too: they were sent.
    pub calls: u64,
    /// Microseconds Redis spent executing them (for a script, with the commands it ran).
    pub usec: u64,
}

/// What clients sent between two [`command_calls`] snapshots.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sent {
    /// How many commands.
    pub commands: u64,
    /// The microseconds Redis spent executing them.
    pub usec: u64,
}

/// Every command's figures so far, from `INFO commandstats`.
pub fn command_calls(connection: &mut redis::Connection) -> HashMap<String, CommandStat> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(connection)
        .expect("INFO commandstats");
    info.lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let mut stat = CommandStat::default();
            for (field, value) in stats.split(',').filter_map(|f| f.split_once('=')) {
                let Ok(value) = value.parse::<u64>() else {
                    continue;
                };
                match field {
                    "calls" | "rejected_calls" | "failed_calls" => stat.calls += value,
                    "usec" => stat.usec = value,
                    _ => {}
                }
            }
            Some((name.to_owned(), stat))
        })
        .collect()
}

/// What clients sent between two [`command_calls`] snapshots: every command but those that ran
/// inside scripts, the inspection commands and the listener's upkeep.
pub fn commands_sent(
    before: &HashMap<String, CommandStat>,
    after: &HashMap<String, CommandStat>,
) -> Sent {
    let sent = after.iter().filter(|(name, _)| {
        ![INSIDE_SCRIPTS, INSPECTION, UPKEEP]
            .iter()
            .any(|names| names.contains(&name.as_str()))
    });
    let mut total = Sent::default();
    for (name, stat) in sent {
        let earlier = before.get(name).copied().unwrap_or_default();
        total.commands += stat.calls.saturating_sub(earlier.calls);
        total.usec += stat.usec.saturating_sub(earlier.usec);
    }
    total
}

/// Script and function calls (`FCALL`, `EVALSHA` and `EVAL`) a server has run so far, and the µs
/// it spent in them.
pub fn script_calls(connection: &mut redis::Connection) -> Sent {
    let calls = command_calls(connection);
    ["fcall", "evalsha", "eval"]
        .iter()
        .filter_map(|name| calls.get(*name))
        .fold(Sent::default(), |total, stat| Sent {
            commands: total.commands + stat.calls,
            usec: total.usec + stat.usec,
        })
}
