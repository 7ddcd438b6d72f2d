//! Counting the commands clients send, from `INFO commandstats`.

use std::collections::HashMap;

use deadpool_redis::redis;

/// Commands redlimit's scripts run inside `EVALSHA`: Redis counts them in `commandstats` too,
/// but they cost no round trip.
const INSIDE_SCRIPTS: &[&str] = &[
    "time",
    "hmget",
    "hset",
    "hincrby",
    "pexpire",
    "get",
    "set",
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

/// Calls per command so far (rejected and failed calls too: they were sent).
pub fn command_calls(connection: &mut redis::Connection) -> HashMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(connection)
        .expect("INFO commandstats");
    info.lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let sent = stats
                .split(',')
                .filter_map(|field| field.split_once('='))
                .filter(|(k, _)| matches!(*k, "calls" | "rejected_calls" | "failed_calls"))
                .filter_map(|(_, v)| v.parse::<u64>().ok())
                .sum();
            Some((name.to_owned(), sent))
        })
        .collect()
}

/// Commands clients sent between two [`command_calls`] snapshots: everything but what ran
/// inside scripts and the inspection commands.
pub fn commands_sent(before: &HashMap<String, u64>, after: &HashMap<String, u64>) -> u64 {
    after
        .iter()
        .filter(|(name, _)| {
            !INSIDE_SCRIPTS.contains(&name.as_str()) && !INSPECTION.contains(&name.as_str())
        })
        .map(|(name, calls)| calls.saturating_sub(before.get(name).copied().unwrap_or(0)))
        .sum()
}
