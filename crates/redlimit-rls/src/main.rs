//! `redlimit-rls`: Envoy's global rate limit service on redlimit.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::ExitCode,
    time::{Duration, SystemTime},
};

use redlimit::{FailurePolicy, Limiter, MemoryBackend, RedisBackend, redacted_url};
use redlimit_rls::{
    RlsConfig, RlsService,
    envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer,
};

const USAGE: &str = "usage: redlimit-rls --config DIR [--redis URL] [--listen ADDR] \
[--failure open|closed|local] [--budget DURATION]
  --config   a folder of envoyproxy/ratelimit YAML files (*.yaml, *.yml), reloaded when they change
  --redis    redis:// or rediss:// URL; without it, an in-memory limiter of this process alone
  --listen   the gRPC address; defaults to 127.0.0.1:8081
  --failure  how a check is answered when Redis does not answer in time; defaults to open
  --budget   how long a check may wait for Redis, such as 20ms; defaults to 20ms";

/// How often the configuration folder is looked at.
const RELOAD_EVERY: Duration = Duration::from_secs(1);

struct Args {
    config: PathBuf,
    redis: Option<String>,
    listen: SocketAddr,
    failure: FailurePolicy,
    budget: Duration,
}

fn parse(args: &[String]) -> Result<Args, String> {
    let mut parsed = Args {
        config: PathBuf::new(),
        redis: None,
        listen: SocketAddr::from(([127, 0, 0, 1], 8081)),
        failure: FailurePolicy::Open,
        budget: Duration::from_millis(20),
    };
    let mut config = None;
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--config" => config = Some(PathBuf::from(value)),
            "--redis" => parsed.redis = Some(value.clone()),
            "--listen" => {
                parsed.listen = value
                    .parse()
                    .map_err(|e| format!("--listen: {value:?}: {e}"))?;
            }
            "--failure" => {
                parsed.failure = match value.as_str() {
                    "open" => FailurePolicy::Open,
                    "closed" => FailurePolicy::Closed,
                    "local" => FailurePolicy::local(),
                    _ => return Err(format!("--failure: {value:?} is not open, closed or local")),
                };
            }
            "--budget" => {
                parsed.budget = humantime::parse_duration(value)
                    .map_err(|e| format!("--budget: {value:?}: {e}"))?;
            }
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    parsed.config = config.ok_or("--config is required")?;
    Ok(parsed)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let args = match parse(&args) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("redlimit-rls: {message}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let config = match RlsConfig::load_dir(&args.config) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("redlimit-rls: {error}");
            return ExitCode::from(1);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(serve(args, config))
}

async fn serve(args: Args, config: RlsConfig) -> ExitCode {
    let limiter = match &args.redis {
        Some(url) => match RedisBackend::builder(url.as_str()).build() {
            Ok(redis) => Limiter::new(redis),
            Err(error) => {
                eprintln!("redlimit-rls: --redis {}: {error}", redacted_url(url));
                return ExitCode::from(2);
            }
        },
        None => Limiter::new(MemoryBackend::default()),
    };
    tracing::info!(
        rules = config.rules(),
        backend = args.redis.as_deref().map_or("memory".to_owned(), redacted_url),
        listen = %args.listen,
        "redlimit-rls serving"
    );
    let service = RlsService::new(limiter, config, args.failure, args.budget);
    tokio::spawn(reload(args.config.clone(), service.clone()));
    let served = tonic::transport::Server::builder()
        .add_service(RateLimitServiceServer::new(service))
        .serve_with_shutdown(args.listen, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await;
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("redlimit-rls: serving on {}: {error}", args.listen);
            ExitCode::from(1)
        }
    }
}

/// Reloads the configuration whenever a file in `dir` changes; a configuration that does not
/// load leaves the last good one in force, and says why.
async fn reload(dir: PathBuf, service: RlsService) {
    let mut seen = stamp(&dir);
    loop {
        tokio::time::sleep(RELOAD_EVERY).await;
        let now = stamp(&dir);
        if now == seen {
            continue;
        }
        seen = now;
        match RlsConfig::load_dir(&dir) {
            Ok(config) => {
                tracing::info!(rules = config.rules(), "configuration reloaded");
                service.reload(config);
            }
            Err(error) => {
                tracing::warn!(%error, "configuration not reloaded; the last good one stays");
            }
        }
    }
}

/// The names, sizes and times of the files in `dir`: what a change changes.
fn stamp(dir: &Path) -> Vec<(PathBuf, u64, Option<SystemTime>)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let meta = entry.metadata().ok()?;
            Some((entry.path(), meta.len(), meta.modified().ok()))
        })
        .collect();
    files.sort();
    files
}
