//! `cargo run --release -p redlimit-bench [-- OPTIONS]`: redlimit side by side with a raw
//! redis-rs baseline on the same Redis, in one run. Prints a table per mode and one JSON line per
//! contender. Without `--redis URL` it starts its own `redis-server` on a free loopback port.

mod accuracy;
mod accuracy_chart;
mod client_header;
mod decisions;
mod drive;
mod flood;
mod hot_key;
mod http;
mod instructions;
mod memory_table;
mod pipeline;
mod process_cpu;
mod report;
mod rls;
mod saturate;
mod saturation;

use std::process::ExitCode;

use redlimit_tests::RedisServer;
use saturation::Keys;

const USAGE: &str =
    "usage: redlimit-bench [--mode all|decisions|saturation|saturate|http|flood|memory|accuracy|
  instructions|hot-key|rls] [--redis URL] [--decisions N] [--concurrency C] [--keys K] [--rounds R]
  [--workers W] [--chart PATH] [--only NAME,NAME]
accuracy (not part of all) needs no Redis and draws its SVG to PATH (docs/accuracy.svg);
instructions (not part of all) runs a redis-server of its own under valgrind's callgrind;
hot-key (not part of all) drives one key from 4 processes (C in flight each), exact and with grants;
defaults: all modes, N = 200000, C = 64, K = 10000, R = 24 rounds, W = 1 tokio worker,
limit 100 per 60 s, and a redis-server of its own; --only keeps the saturation, saturate,
instructions and http modes to the contenders named (and their baselines: the naive script,
http_bare)";

/// What to run.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    mode: String,
    /// Where `--mode accuracy` draws its picture.
    chart: String,
    redis: Option<String>,
    pub(crate) decisions: usize,
    pub(crate) concurrency: usize,
    pub(crate) keys: usize,
    pub(crate) rounds: usize,
    workers: usize,
    /// The saturation and instructions contenders to run (besides the naive script); all if
    /// empty.
    only: Vec<String>,
}

impl Settings {
    fn parse(args: &[String]) -> Result<Self, String> {
        let mut settings = Self {
            mode: "all".to_owned(),
            chart: "docs/accuracy.svg".to_owned(),
            redis: None,
            decisions: 200_000,
            concurrency: 64,
            keys: 10_000,
            rounds: 24,
            workers: 1,
            only: Vec::new(),
        };
        let mut args = args.iter();
        while let Some(flag) = args.next() {
            let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
            let number = || {
                value
                    .parse::<usize>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| format!("{flag}: {value:?} is not a positive number"))
            };
            match flag.as_str() {
                "--mode" => settings.mode = value.clone(),
                "--redis" => settings.redis = Some(value.clone()),
                "--decisions" => settings.decisions = number()?,
                "--concurrency" => settings.concurrency = number()?,
                "--keys" => settings.keys = number()?,
                "--rounds" => settings.rounds = number()?,
                "--workers" => settings.workers = number()?,
                "--chart" => settings.chart = value.clone(),
                "--only" => settings.only = value.split(',').map(str::to_owned).collect(),
                _ => return Err(format!("unknown option {flag}")),
            }
        }
        if ![
            "all",
            "decisions",
            "saturation",
            "saturate",
            "http",
            "flood",
            "memory",
            "accuracy",
            "instructions",
            "hot-key",
            "rls",
        ]
        .contains(&settings.mode.as_str())
        {
            return Err(format!("--mode: {:?} is not a mode", settings.mode));
        }
        Ok(settings)
    }

    fn runs(&self, mode: &str) -> bool {
        self.mode == "all" || self.mode == mode
    }

    /// Whether the contender `name` runs, by `--only`.
    pub(crate) fn keeps(&self, name: &str) -> bool {
        self.only.is_empty() || name == decisions::NAIVE || self.only.iter().any(|n| n == name)
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(hot_key::WORKER) {
        return hot_key::worker(&args[1..]);
    }
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let settings = match Settings::parse(&args) {
        Ok(settings) => settings,
        Err(message) => {
            eprintln!("redlimit-bench: {message}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if settings.mode == "accuracy" {
        return accuracy(&settings.chart);
    }
    if settings.mode == "instructions" {
        return instructions(&settings);
    }
    let own_server = settings.redis.is_none().then(RedisServer::start);
    let url = settings
        .redis
        .clone()
        .or_else(|| own_server.as_ref().map(RedisServer::url))
        .unwrap_or_default();
    let runtime = |name: &str| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(settings.workers)
            .thread_name(name)
            .enable_all()
            .build()
            .expect("a tokio runtime")
    };
    let load = runtime("bench-load");
    let server = runtime(http::SERVER_THREAD);
    println!(
        "redlimit-bench: redis {url}{}; tokio workers: {} (load) + {} (http server); \
         N = {}, C = {}, K = {}, {} interleaved rounds; limit 100 per 60 s; {} cores",
        if own_server.is_some() {
            " (started by the bench)"
        } else {
            ""
        },
        settings.workers,
        settings.workers,
        settings.decisions,
        settings.concurrency,
        settings.keys,
        settings.rounds,
        std::thread::available_parallelism().map_or(0, usize::from),
    );
    if settings.runs("decisions") {
        let rows = load.block_on(decisions::run(&url, &settings));
        report::print(
            "decisions (one check per call, over K keys)",
            &rows,
            decisions::NAIVE,
        );
    }
    if settings.runs("decisions") || settings.mode == "saturation" {
        let (uniform, zipf) = saturation::run(&url, &settings);
        let title = format!(
            "saturation, uniform keys (2 client threads × 256 in flight; Redis µs = redis-server \
             CPU per decision; cmds/dec = script calls per decision; median of {} rounds)",
            saturation::rounds(&settings)
        );
        report::print(&title, &uniform.rows, decisions::NAIVE);
        saturation::print_sums(&uniform.rows, "Redis µs", |row| row.redis_us_per_decision);
        uniform.print_paired();
        report::print(
            "saturation, Zipf keys (s = 1.1 over K)",
            &zipf.rows,
            decisions::NAIVE,
        );
        saturation::print_sums(&zipf.rows, "Redis µs", |row| row.redis_us_per_decision);
        zipf.print_paired();
    }
    if settings.runs("saturate") {
        let (rows, by_round) = saturate::run(&url, &settings);
        report::print(
            "saturate (64 connections, 16 commands in flight each: each script at Redis \
             saturation; Redis µs = time inside its calls per decision)",
            &rows,
            decisions::NAIVE,
        );
        saturate::print_paired(&rows, &by_round);
    }
    if settings.runs("http") {
        let (mut servers, recorder) = http::start_servers(&server, &url);
        servers.retain(|(name, _)| *name == "http_bare" || settings.keeps(name));
        let rows = load.block_on(http::run(&url, &servers, &settings));
        report::print(
            "http (axum hello-world, keep-alive loopback)",
            &rows,
            "http_bare",
        );
        println!(
            "http_memory_metrics: a Prometheus recorder counted {} decisions; the other \
             contenders' guards were built before it was installed and count into none",
            http::decisions_recorded(&recorder)
        );
    }
    if settings.mode == "hot-key" {
        let rows = hot_key::run(&url, &settings);
        let title = format!(
            "hot key (one key from 4 processes × {} in flight, limit N / 2 an hour; median of {} \
             rounds by decisions/s)",
            settings.concurrency, settings.rounds
        );
        report::print(&title, &rows, "fixed_window_anchored");
    }
    if settings.runs("rls") {
        let rows = load.block_on(rls::run(&url, &settings, server.handle().clone()));
        report::print(
            "rls (ShouldRateLimit over gRPC on loopback, one and three descriptors, beside a \
             guard's same checks in process)",
            &rows,
            "guard_one",
        );
        match &own_server {
            Some(redis) => load.block_on(rls::stalled(&url, redis, server.handle().clone())),
            None => println!("rls stalled: needs the bench's own redis-server (no --redis)"),
        }
    }
    if settings.runs("flood") {
        let rows = load.block_on(flood::run(&url, &settings));
        report::print(
            "flood (90% of checks from one client over its limit)",
            &rows,
            "flood_no_cache",
        );
    }
    if settings.runs("memory") || settings.runs("decisions") {
        let growth = load.block_on(memory_table::sliding_log_growth(&url));
        println!("\nsliding_window_log: Redis bytes per key filled to its limit");
        for (limit, bytes) in growth {
            println!("  limit {limit:>6}: {bytes:>9.0} bytes");
            println!(
                "{{\"mode\":\"memory\",\"contender\":\"sliding_window_log_{limit}\",\"bytes_per_key\":{bytes:.0}}}"
            );
        }
    }
    ExitCode::SUCCESS
}

/// `--mode accuracy`: the table, and the picture at `chart`.
fn accuracy(chart: &str) -> ExitCode {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a tokio runtime");
    let (phases, outcomes, summaries) = runtime.block_on(accuracy::run());
    let requests = outcomes.first().map_or(0, |o| o.admitted.len());
    accuracy::print(&phases, &summaries, requests);
    if let Some(folder) = std::path::Path::new(chart).parent() {
        let _ = std::fs::create_dir_all(folder);
    }
    match accuracy_chart::draw(chart, &phases, &outcomes) {
        Ok(()) => {
            println!("accuracy: drawn to {chart}");
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("redlimit-bench: drawing {chart}: {message}");
            ExitCode::from(1)
        }
    }
}

/// `--mode instructions`: every saturation contender's instructions per decision.
fn instructions(settings: &Settings) -> ExitCode {
    if !instructions::available() {
        eprintln!(
            "redlimit-bench: --mode instructions needs valgrind and callgrind_control \
             (Debian: apt-get install valgrind)"
        );
        return ExitCode::from(1);
    }
    println!(
        "redlimit-bench: N = {} counted decisions per contender after 5 K to warm up, K = {}",
        settings.decisions, settings.keys
    );
    for (name, keys) in [
        ("uniform", Keys::uniform(settings.keys)),
        ("Zipf (s = 1.1)", Keys::zipf(settings.keys)),
    ] {
        instructions::print(&instructions::run(settings, &keys), name);
    }
    ExitCode::SUCCESS
}
