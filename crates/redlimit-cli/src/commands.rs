//! The commands: each reads or changes the state of the clients of one policy, found by a
//! demo configuration's route or a policy named on the command line; `suggest` is advice and
//! changes nothing.

use std::{fmt::Write as _, time::Duration};

use redlimit_core::{Inspection, Limiter, Override, Policy, PolicySet, RedisBackend, RetryAfter};
use redlimit_rls::RlsConfig;
use serde::Serialize;

use axum_demo::{
    Config,
    config::{RedisUrl, Route, Store},
};

use crate::{
    args::{Args, Command},
    distribution::Distribution,
    other_numbers,
};

/// `redlimit --help`.
pub(crate) const USAGE: &str = "usage:
  redlimit COMMAND --policy NAME:ALGORITHM:LIMIT/WINDOW[:BURST][@GROUP] --redis URL [--prefix P] ...
                  (any application's keys: no file; --route is not needed; @GROUP names the
                  policy's key group)
  redlimit inspect --config FILE --route PATH --client KEY [--redis URL]
  redlimit reset   --config FILE --route PATH --client KEY [--redis URL]
  redlimit check   --config FILE --route PATH --client KEY [--redis URL]
  redlimit top     --config FILE --route PATH [--count N] [--scan-calls N] [--redis URL]
  redlimit suggest --config FILE [--headroom X] [--scan-calls N] [--json] [--redis URL]
  redlimit override --config FILE --route PATH --client KEY --ttl DURATION
                    [--limit N] [--window DURATION] [--burst N] [--redis URL]
  redlimit clear-override --config FILE --route PATH --client KEY [--redis URL]
  redlimit COMMAND --rls DIR --domain D --descriptor KEY=VALUE[,KEY=VALUE...] --redis URL
                  (a rate limit service's descriptor, by its YAML folder: inspect, reset,
                  check, top, override, clear-override)

FILE is redlimit-demo's TOML; its Redis (redis_url, redis_cluster or redis_sentinel) is used
unless --redis names a standalone one. KEY is the client as the route keys it (an IP, a header's
value). inspect consumes nothing; check consumes one request; reset deletes the client's state.
top lists the clients closest to or over their limit (default 10), found by SCAN (at most
--scan-calls calls of 1,000 keys per primary, default 1,000; never KEYS). suggest prints, per
route, the distribution of per-client usage in live keys and p99 x headroom (default 1.5) as a
suggested limit: advice only, it changes nothing. override gives one client of a route with
overrides = true other numbers (what it leaves out stays the route's) for --ttl, such as 1h,
read by every instance at its next check; clear-override ends it.";

/// Why the tool stopped: its message and exit status (2: the command line or the file, 1:
/// Redis).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    /// What went wrong.
    pub(crate) message: String,
    /// The exit status.
    pub(crate) status: u8,
}

fn usage(message: impl Into<String>) -> Failure {
    Failure {
        message: message.into(),
        status: 2,
    }
}

fn redis(error: &redlimit_core::Error) -> Failure {
    Failure {
        message: format!("redis: {error}"),
        status: 1,
    }
}

/// The operator's commands take their time: a scan is many round trips.
const BUDGET: Duration = Duration::from_secs(5);

/// Runs the command; what to print on success.
///
/// # Errors
/// A bad command line or file (status 2), or a failing Redis (status 1).
pub(crate) async fn run(args: &Args) -> Result<String, Failure> {
    if let Some(dir) = args.flag("--rls") {
        let (limiter, policy, client) = rls_target(args, dir)?;
        let place = format!(
            "{} {}",
            args.flag("--domain").unwrap_or_default(),
            policy.name()
        );
        return on_policy(args, &limiter, &policy, &client, &place).await;
    }
    let config = config(args)?;
    let limiter = axum_demo::limiter(&config).map_err(|e| usage(e.to_string()))?;
    if args.command == Command::Suggest {
        return suggest(args, &config, &limiter).await;
    }
    let route = route(args, &config)?;
    let policy = route.policy().map_err(|e| usage(e.to_string()))?;
    let client = args.flag("--client").unwrap_or_default();
    on_policy(args, &limiter, &policy, client, &route.path).await
}

/// The limiter, policy and client key of a rate limit service's descriptor: `--rls` (its
/// configuration folder), `--domain`, `--descriptor key=value,key=value`, on `--redis` under
/// the service's key prefix (`--prefix`, else the library's).
fn rls_target(args: &Args, dir: &str) -> Result<(Limiter, Policy, String), Failure> {
    let config =
        RlsConfig::load_dir(std::path::Path::new(dir)).map_err(|e| usage(e.to_string()))?;
    let domain = args.flag("--domain").unwrap_or_default();
    let text = args.flag("--descriptor").unwrap_or_default();
    let entries: Vec<(&str, &str)> = text
        .split(',')
        .map(|entry| entry.split_once('=').unwrap_or((entry, "")))
        .collect();
    if entries.iter().any(|(key, _)| key.is_empty()) {
        return Err(usage(format!(
            "--descriptor: {text:?} is not key=value[,key=value…], such as remote_address=10.0.0.1"
        )));
    }
    let (policy, client) = config.policy_of(domain, &entries).ok_or_else(|| {
        usage(format!(
            "--descriptor: no rule with a limit to count matches {text:?} in domain {domain:?}"
        ))
    })?;
    let url = args.flag("--redis").unwrap_or_default();
    let backend = RedisBackend::builder(url)
        .budget(BUDGET)
        .build()
        .map_err(|e| usage(format!("--redis: {e}")))?;
    let limiter = match args.flag("--prefix") {
        Some(prefix) => {
            Limiter::with_prefix(backend, prefix).map_err(|e| usage(format!("--prefix: {e}")))?
        }
        None => Limiter::new(backend),
    };
    Ok((limiter, policy, client))
}

/// Runs the command (not `suggest`) on `client`'s state under `policy`, which `place` names
/// (a route's path, or a descriptor's rule).
async fn on_policy(
    args: &Args,
    limiter: &Limiter,
    policy: &Policy,
    client: &str,
    place: &str,
) -> Result<String, Failure> {
    match args.command {
        Command::Inspect => {
            let seen = limiter
                .inspect(policy, client)
                .await
                .map_err(|e| redis(&e))?;
            let mut out = describe(&seen);
            if seen.ttl.is_none() {
                out += &hint(args, limiter, policy).await;
            }
            Ok(out)
        }
        Command::Reset => {
            let deleted = limiter.reset(policy, client).await.map_err(|e| redis(&e))?;
            Ok(if deleted {
                format!("reset: {client}'s state on {place} deleted\n")
            } else {
                format!("reset: nothing stored for {client} on {place}\n")
            })
        }
        Command::Check => {
            let decision = limiter
                .check(&PolicySet::from(policy.clone()), client)
                .await
                .map(|d| d[0].clone())
                .map_err(|e| redis(&e))?;
            let verdict = if decision.allowed {
                "allowed"
            } else {
                "denied"
            };
            Ok(format!(
                "{verdict}: {} of {} remaining, full in {}{}\n",
                decision.remaining,
                policy.quota(decision.limit),
                seconds(decision.reset_after),
                retry(decision.retry_after)
            ))
        }
        Command::Top => top(args, policy, limiter).await,
        Command::Override => {
            let numbers = numbers(args)?;
            let ttl = duration(args, "--ttl")?.unwrap_or_default();
            limiter
                .set_override(policy, client, numbers, ttl)
                .await
                .map_err(|e| failed(&e))?;
            Ok(format!(
                "override: {client} on {} for {}\n",
                place,
                humantime::format_duration(ttl)
            ))
        }
        Command::ClearOverride => {
            let cleared = limiter
                .clear_override(policy, client)
                .await
                .map_err(|e| failed(&e))?;
            Ok(if cleared {
                format!(
                    "clear-override: {client} on {} is back on the route's numbers\n",
                    place
                )
            } else {
                format!("clear-override: {client} had no override on {}\n", place)
            })
        }
        Command::Suggest => unreachable!("answered above"),
    }
}

/// A bad request (status 2) or a failing Redis (status 1).
fn failed(error: &redlimit_core::Error) -> Failure {
    if error.kind() == redlimit_core::ErrorKind::InvalidInput {
        return usage(error.to_string());
    }
    redis(error)
}

/// The override's numbers from `--limit`, `--window` and `--burst`.
fn numbers(args: &Args) -> Result<Override, Failure> {
    let mut numbers = Override::default();
    if args.flag("--limit").is_some() {
        numbers = numbers.limit(args.number("--limit", 0).map_err(usage)?);
    }
    if let Some(window) = duration(args, "--window")? {
        numbers = numbers.window(window);
    }
    if args.flag("--burst").is_some() {
        numbers = numbers.burst(args.number("--burst", 0).map_err(usage)?);
    }
    Ok(numbers)
}

/// The value of `flag` as a duration such as `1h30m`, if given.
fn duration(args: &Args, flag: &str) -> Result<Option<Duration>, Failure> {
    args.flag(flag)
        .map(|value| {
            humantime::parse_duration(value).map_err(|e| usage(format!("{flag}: {value:?}: {e}")))
        })
        .transpose()
}

/// The file, with `--redis` in place of its store and the tool's budget.
fn config(args: &Args) -> Result<Config, Failure> {
    let path = args.flag("--config").unwrap_or_default();
    let mut config = match args.flag("--policy") {
        Some(spec) => named_policy(spec)?,
        None => {
            let text = std::fs::read_to_string(path).map_err(|e| usage(format!("{path}: {e}")))?;
            Config::parse(&text).map_err(|e| usage(format!("{path}: {e}")))?
        }
    };
    if let Some(prefix) = args.flag("--prefix") {
        config.key_prefix = Some(prefix.to_owned());
    }
    if let Some(url) = args.flag("--redis") {
        let url: RedisUrl = serde::Deserialize::deserialize(serde::de::value::StrDeserializer::<
            serde::de::value::Error,
        >::new(url))
        .map_err(|e| usage(format!("--redis: {e}")))?;
        config.redis_url = Some(url);
        config.redis_cluster = None;
        config.redis_sentinel = None;
    }
    if config.store().map_err(|e| usage(e.to_string()))? == Store::Memory {
        return Err(usage(format!(
            "{path}: no redis_url, redis_cluster or redis_sentinel, and no --redis: the \
             in-memory backend lives in the demo's process, out of reach"
        )));
    }
    config.budget = BUDGET;
    Ok(config)
}

/// For a policy named on the command line that found nothing: the numbers its name's keys do
/// have, if any (a number off by one otherwise reads as "no state, all remaining").
async fn hint(args: &Args, limiter: &Limiter, policy: &Policy) -> String {
    match (args.flag("--policy"), args.flag("--redis")) {
        (Some(_), Some(url)) => other_numbers::warning(url, limiter, policy)
            .await
            .unwrap_or_default(),
        _ => String::new(),
    }
}

/// The configuration of one route checked by the policy `spec` names
/// (`NAME:ALGORITHM:LIMIT/WINDOW[:BURST][@GROUP]`, such as `login:fixed_window:5/15m`, or
/// `api:gcra:20/1s:40@api` for a policy of key group `api`); the caller adds `--redis` and
/// `--prefix`. What an application that is not the demo needs to reach its clients' keys.
fn named_policy(spec: &str) -> Result<Config, Failure> {
    let bad = || {
        usage(format!(
            "--policy: {spec:?} is not NAME:ALGORITHM:LIMIT/WINDOW[:BURST][@GROUP], such as \
             login:fixed_window:5/15m"
        ))
    };
    let (spec, group) = match spec.split_once('@') {
        Some((spec, group)) => (spec, Some(group)),
        None => (spec, None),
    };
    let mut parts = spec.split(':');
    let (Some(name), Some(algorithm), Some(numbers)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(bad());
    };
    let (limit, window) = numbers.split_once('/').ok_or_else(bad)?;
    let burst = parts.next();
    if parts.next().is_some() {
        return Err(bad());
    }
    // Each value goes into the TOML as a number or a string of plain characters (names,
    // algorithms and durations have no others), so nothing in it can end the string.
    let quoted = |text: &str| {
        let plain = |c: char| c.is_ascii_alphanumeric() || "_-. ".contains(c);
        if text.chars().all(plain) {
            Ok(format!("\"{text}\""))
        } else {
            Err(bad())
        }
    };
    let number = |text: &str| text.parse::<u64>().map_err(|_| bad());
    let mut text = format!(
        "[[route]]\npath = \"/\"\nname = {}\nalgorithm = {}\nlimit = {}\nwindow = {}\n",
        quoted(name)?,
        quoted(algorithm)?,
        number(limit)?,
        quoted(window)?
    );
    if let Some(burst) = burst {
        text += &format!("burst = {}\n", number(burst)?);
    }
    if let Some(group) = group {
        text += &format!("key_group = {}\n", quoted(group)?);
    }
    Config::parse(&text).map_err(|e| usage(format!("--policy: {e}")))
}

fn route<'a>(args: &Args, config: &'a Config) -> Result<&'a Route, Failure> {
    if args.flag("--policy").is_some() {
        return config
            .routes
            .first()
            .ok_or_else(|| usage("--policy: no route"));
    }
    let path = args.flag("--route").unwrap_or_default();
    config
        .routes
        .iter()
        .find(|r| r.path == path)
        .ok_or_else(|| {
            let paths: Vec<&str> = config.routes.iter().map(|r| r.path.as_str()).collect();
            usage(format!(
                "--route: no route {path:?}; the file has {}",
                paths.join(", ")
            ))
        })
}

/// A wait for people: whole seconds rounded up (as `Retry-After`), or milliseconds below one.
fn seconds(d: Duration) -> String {
    let shown = if d < Duration::from_secs(1) {
        Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    } else {
        Duration::from_secs(d.as_secs() + u64::from(d.subsec_nanos() > 0))
    };
    humantime::format_duration(shown).to_string()
}

fn retry(retry: Option<RetryAfter>) -> String {
    match retry {
        Some(RetryAfter::After(wait)) => format!(", retry in {}", seconds(wait)),
        Some(_) => ", never within this policy".to_owned(),
        None => String::new(),
    }
}

fn describe(seen: &Inspection) -> String {
    let d = &seen.decision;
    let state: Vec<String> = seen.state.iter().map(|(f, v)| format!("{f}={v}")).collect();
    let mut out = String::new();
    let _ = writeln!(out, "key        {}", seen.key);
    let _ = writeln!(
        out,
        "next       {}{}",
        if d.allowed { "allowed" } else { "denied" },
        retry(d.retry_after)
    );
    let _ = writeln!(out, "remaining  {} of {}", d.remaining, seen.quota);
    let _ = writeln!(out, "full in    {}", seconds(d.reset_after));
    let _ = writeln!(
        out,
        "ttl        {}",
        seen.ttl
            .map_or_else(|| "none (no state)".to_owned(), seconds)
    );
    let _ = writeln!(
        out,
        "state      {}",
        if state.is_empty() {
            "none".to_owned()
        } else {
            state.join(" ")
        }
    );
    out
}

async fn top(args: &Args, policy: &Policy, limiter: &Limiter) -> Result<String, Failure> {
    let count: usize = args.number("--count", 10).map_err(usage)?;
    let calls = args.number("--scan-calls", 1_000).map_err(usage)?;
    let mut scan = limiter.scan(policy, calls).await.map_err(|e| redis(&e))?;
    // Denied first, then the least remaining, then the most used.
    scan.keys.sort_by_key(|k| {
        (
            k.decision.allowed,
            k.decision.remaining,
            std::cmp::Reverse(k.used()),
        )
    });
    let mut out = format!(
        "{} keys of policy {} in {} SCAN calls{}\n",
        scan.keys.len(),
        policy.name(),
        scan.calls,
        if scan.complete {
            ""
        } else {
            " (stopped at --scan-calls: not every key was seen)"
        }
    );
    let _ = writeln!(
        out,
        "{:<40} {:>12} {:>9}  {:<8} ttl",
        "client", "used", "remaining", "next"
    );
    for key in scan.keys.iter().take(count) {
        let d = &key.decision;
        let _ = writeln!(
            out,
            "{:<40} {:>12} {:>9}  {:<8} {}",
            key.client(),
            format!("{}/{}", key.used(), key.quota),
            d.remaining,
            if d.allowed { "allowed" } else { "denied" },
            key.ttl.map_or_else(String::new, seconds)
        );
    }
    if scan.keys.is_empty() {
        out += &hint(args, limiter, policy).await;
    }
    Ok(out)
}

/// One route's line of `suggest`.
#[derive(Debug, Serialize)]
struct Suggestion {
    route: String,
    policy: String,
    limit: u64,
    window_ms: u128,
    scan_calls: u64,
    complete: bool,
    usage: Option<Distribution>,
}

async fn suggest(args: &Args, config: &Config, limiter: &Limiter) -> Result<String, Failure> {
    let headroom: f64 = args.number("--headroom", 1.5).map_err(usage)?;
    if !headroom.is_finite() || headroom <= 0.0 {
        return Err(usage("--headroom: must be more than 0"));
    }
    let calls = args.number("--scan-calls", 1_000).map_err(usage)?;
    let mut lines = Vec::new();
    for route in &config.routes {
        let policy = route.policy().map_err(|e| usage(e.to_string()))?;
        let scan = limiter.scan(&policy, calls).await.map_err(|e| redis(&e))?;
        let limited = scan.keys.iter().filter(|k| !k.decision.allowed).count();
        let used = scan.keys.iter().map(Inspection::used).collect();
        lines.push(Suggestion {
            route: route.path.clone(),
            policy: policy.name().to_owned(),
            limit: policy.limit(),
            window_ms: policy.window().as_millis(),
            scan_calls: scan.calls,
            complete: scan.complete,
            usage: Distribution::of(used, limited, headroom),
        });
    }
    if args.json {
        let mut json = serde_json::to_string_pretty(&lines).map_err(|e| usage(e.to_string()))?;
        json.push('\n');
        return Ok(json);
    }
    let mut out = format!(
        "{:<24} {:>8} {:>8} {:>6} {:>6} {:>6} {:>6} {:>8} {:>7} {:>9}\n",
        "route", "limit", "clients", "p50", "p90", "p99", "max", "limited", "window", "suggested"
    );
    for line in &lines {
        let window = seconds(Duration::from_millis(
            u64::try_from(line.window_ms).unwrap_or(u64::MAX),
        ));
        match &line.usage {
            Some(u) => {
                let _ = writeln!(
                    out,
                    "{:<24} {:>8} {:>8} {:>6} {:>6} {:>6} {:>6} {:>7.1}% {:>7} {:>9}",
                    line.route,
                    line.limit,
                    u.clients,
                    u.p50,
                    u.p90,
                    u.p99,
                    u.max,
                    u.limited_share * 100.0,
                    window,
                    u.suggested_limit
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "{:<24} {:>8} {:>8} {:>49}",
                    line.route, line.limit, 0, "no live keys: nothing to suggest"
                );
            }
        }
    }
    out.push_str(&format!(
        "usage is requests in the current window (limit less remaining); suggested = p99 x {headroom}, rounded up. Advice only: nothing was changed.\n"
    ));
    Ok(out)
}
