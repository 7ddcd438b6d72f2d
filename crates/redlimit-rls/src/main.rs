//! `redlimit-rls`: Envoy's global rate limit service on redlimit.

use std::{net::SocketAddr, path::PathBuf, process::ExitCode, time::Duration};

use metrics_exporter_prometheus::PrometheusBuilder;
use redlimit::{FailurePolicy, Limiter, MemoryBackend, RedisBackend, redacted_url};
use redlimit_rls::{
    RlqsService, RlsConfig, RlsService,
    envoy_types::pb::envoy::service::{
        rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer,
        ratelimit::v3::rate_limit_service_server::RateLimitServiceServer,
    },
};

const USAGE: &str = "usage: redlimit-rls --config DIR [--redis URL | --redis-cluster URL,URL... |
  --redis-sentinel URL,URL... --sentinel-master NAME] [--listen ADDR] [--response-headers on] \
[--metrics ADDR] [--failure open|closed|local] [--budget DURATION] [--quota-max N]
  [--quota-interval DURATION]
  --config   a folder of envoyproxy/ratelimit YAML files (*.yaml, *.yml), reloaded when they change
  --redis    redis:// or rediss:// URL; without any, an in-memory limiter of this process alone
  --redis-cluster   a Redis Cluster's nodes; --redis-sentinel: Sentinels, with --sentinel-master
  --response-headers on: RateLimit-Limit, -Remaining and -Reset for Envoy to add
  --listen   the gRPC address (ShouldRateLimit, and grpc.health.v1); defaults to 127.0.0.1:8081
  --metrics  an address serving GET /metrics in Prometheus's text format; defaults to none
  --failure  how a check is answered when Redis does not answer in time; defaults to open
  --budget   how long a check may wait for Redis, such as 20ms; defaults to 20ms
  --quota-max       RLQS: the most units one assignment holds; defaults to 1000
  --quota-interval  RLQS: the longest an assignment lives (the proxies' reporting interval);
                    defaults to 1s";

struct Args {
    config: PathBuf,
    redis: Option<String>,
    cluster: Vec<String>,
    sentinel: Vec<String>,
    master: Option<String>,
    headers: bool,
    listen: SocketAddr,
    metrics: Option<SocketAddr>,
    failure: FailurePolicy,
    budget: Duration,
    quota_max: u64,
    quota_interval: Duration,
}

fn parse(args: &[String]) -> Result<Args, String> {
    let mut parsed = Args {
        config: PathBuf::new(),
        redis: None,
        cluster: Vec::new(),
        sentinel: Vec::new(),
        master: None,
        headers: false,
        listen: SocketAddr::from(([127, 0, 0, 1], 8081)),
        metrics: None,
        failure: FailurePolicy::Open,
        budget: Duration::from_millis(20),
        quota_max: 1_000,
        quota_interval: Duration::from_secs(1),
    };
    let mut config = None;
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--config" => config = Some(PathBuf::from(value)),
            "--redis" => parsed.redis = Some(value.clone()),
            "--redis-cluster" => parsed.cluster = value.split(',').map(str::to_owned).collect(),
            "--redis-sentinel" => parsed.sentinel = value.split(',').map(str::to_owned).collect(),
            "--sentinel-master" => parsed.master = Some(value.clone()),
            "--response-headers" => {
                parsed.headers = match value.as_str() {
                    "on" => true,
                    "off" => false,
                    _ => return Err(format!("--response-headers: {value:?} is not on or off")),
                };
            }
            "--listen" => {
                parsed.listen = value
                    .parse()
                    .map_err(|e| format!("--listen: {value:?}: {e}"))?;
            }
            "--metrics" => {
                let address = value
                    .parse()
                    .map_err(|e| format!("--metrics: {value:?}: {e}"))?;
                parsed.metrics = Some(address);
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
            "--quota-max" => {
                parsed.quota_max =
                    value.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                        format!("--quota-max: {value:?} is not a positive number")
                    })?;
            }
            "--quota-interval" => {
                parsed.quota_interval = humantime::parse_duration(value)
                    .map_err(|e| format!("--quota-interval: {value:?}: {e}"))?;
            }
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    parsed.config = config.ok_or("--config is required")?;
    let stores = [
        parsed.redis.is_some(),
        !parsed.cluster.is_empty(),
        !parsed.sentinel.is_empty(),
    ];
    if stores.iter().filter(|&&s| s).count() > 1 {
        return Err("give one of --redis, --redis-cluster and --redis-sentinel".to_owned());
    }
    if parsed.sentinel.is_empty() != parsed.master.is_none() {
        return Err("--redis-sentinel and --sentinel-master go together".to_owned());
    }
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
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(serve(args))
}

async fn serve(args: Args) -> ExitCode {
    // The recorder first: each rule registers its counters when the configuration loads.
    if let Some(address) = args.metrics
        && let Err(message) = metrics(address).await
    {
        eprintln!("redlimit-rls: --metrics {address}: {message}");
        return ExitCode::from(1);
    }
    let config = match RlsConfig::load_dir(&args.config) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("redlimit-rls: {error}");
            return ExitCode::from(1);
        }
    };
    let backend = match (&args.redis, &args.master) {
        (Some(url), _) => Some(RedisBackend::builder(url.as_str())),
        (None, Some(master)) => Some(RedisBackend::sentinel(&args.sentinel, master.as_str())),
        (None, None) if !args.cluster.is_empty() => Some(RedisBackend::cluster(&args.cluster)),
        (None, None) => None,
    };
    let limiter = match backend.map(|builder| builder.build()) {
        Some(Ok(redis)) => Limiter::new(redis),
        Some(Err(error)) => {
            eprintln!("redlimit-rls: Redis: {error}");
            return ExitCode::from(2);
        }
        None => Limiter::new(MemoryBackend::default()),
    };
    tracing::info!(
        rules = config.rules(),
        backend = store(&args),
        listen = %args.listen,
        "redlimit-rls serving"
    );
    let service =
        RlsService::new(limiter, config, args.failure, args.budget).response_headers(args.headers);
    tokio::spawn(redlimit_rls::watch(args.config.clone(), service.clone()));
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<RateLimitServiceServer<RlsService>>()
        .await;
    let quotas = RlqsService::new(service.clone(), args.quota_max, args.quota_interval);
    let served = tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(RateLimitQuotaServiceServer::new(quotas))
        .add_service(RateLimitServiceServer::new(service))
        .serve_with_shutdown(args.listen, stopped())
        .await;
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("redlimit-rls: serving on {}: {error}", args.listen);
            ExitCode::from(1)
        }
    }
}

/// What the service decides on, for its log: no password shown.
fn store(args: &Args) -> String {
    let list = |urls: &[String]| {
        urls.iter()
            .map(|u| redacted_url(u))
            .collect::<Vec<_>>()
            .join(",")
    };
    match (&args.redis, &args.master) {
        (Some(url), _) => redacted_url(url),
        (None, Some(master)) => format!("sentinel {} ({master})", list(&args.sentinel)),
        (None, None) if !args.cluster.is_empty() => format!("cluster {}", list(&args.cluster)),
        (None, None) => "memory".to_owned(),
    }
}

/// Resolves on SIGINT or SIGTERM: calls under way are answered, new ones refused.
async fn stopped() {
    let terminated = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                term.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminated => {}
    }
    tracing::info!("stopping: answering the calls under way");
}

/// Installs the Prometheus recorder (before any rule registers its counters) and serves it at
/// `address`.
async fn metrics(address: SocketAddr) -> Result<(), String> {
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| e.to_string())?;
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|e| e.to_string())?;
    let upkeep = handle.clone();
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || std::future::ready(handle.render())),
    );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    // Histograms keep samples until upkeep folds them in.
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(5));
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(())
}
