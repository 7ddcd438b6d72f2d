//! `redlimit-demo [--config FILE]`: serves the demo app; see the README.

use std::{net::SocketAddr, process::ExitCode};

use std::path::PathBuf;

use axum::Router;
use axum_demo::{
    Config, Reloadable, app_with, backend_description, install_metrics, limiter, metrics_router,
};

const USAGE: &str = "usage: redlimit-demo [--config FILE]

With no arguments, serves three limited routes on 127.0.0.1:3000 with the in-memory backend.
FILE is TOML: listen, redis_url | redis_cluster | redis_sentinel, trusted_proxies,
client_ip_header, failure, budget, headers, metrics_listen, allow, deny, and [[route]] tables (path, name,
algorithm, limit, window, burst, key, key_group, shadow, mode, max_delay, concurrency, lease_ttl, methods,
failure, budget, allow, deny, handler).
GET /metrics serves Prometheus text.
Logs go to standard error; RUST_LOG filters them (defaults to info). The file is read again
when it changes and on SIGHUP: a valid one replaces the routes (counters kept), an invalid one
is refused with a log line.";

/// The configuration, and the file it came from (watched for changes).
fn load(args: &[String]) -> Result<(Config, Option<PathBuf>), String> {
    match args {
        [] => Ok((Config::demo(), None)),
        [flag, path] if flag == "--config" => {
            let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
            let config = Config::parse(&text).map_err(|e| format!("{path}: {e}"))?;
            Ok((config, Some(PathBuf::from(path))))
        }
        _ => Err(USAGE.to_owned()),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let (config, file) = match load(&args) {
        Ok(loaded) => loaded,
        Err(message) => {
            eprintln!("redlimit-demo: {message}");
            return ExitCode::from(2);
        }
    };
    let metrics = match install_metrics() {
        Ok(handle) => metrics_router(handle),
        Err(message) => {
            eprintln!("redlimit-demo: {message}");
            return ExitCode::from(1);
        }
    };
    let built = limiter(&config).and_then(|limiter| Ok((app_with(&config, &limiter)?, limiter)));
    let router = match built {
        Ok((router, limiter)) => {
            let routes = Reloadable::new(router);
            if let Some(file) = file {
                routes.watch(file, config.clone(), limiter);
            }
            Router::new().fallback_service(routes)
        }
        Err(message) => {
            eprintln!("redlimit-demo: {message}");
            return ExitCode::from(2);
        }
    };
    let listener = match tokio::net::TcpListener::bind(config.listen).await {
        Ok(listener) => listener,
        Err(err) => {
            eprintln!("redlimit-demo: cannot listen on {}: {err}", config.listen);
            return ExitCode::from(1);
        }
    };
    let address = listener.local_addr().unwrap_or(config.listen);
    let router = match config.metrics_listen {
        None => {
            println!("redlimit-demo: metrics on http://{address}/metrics");
            router.merge(metrics)
        }
        Some(at) => match tokio::net::TcpListener::bind(at).await {
            Ok(listener) => {
                println!("redlimit-demo: metrics on http://{at}/metrics");
                tokio::spawn(async move { axum::serve(listener, metrics).await });
                router
            }
            Err(err) => {
                eprintln!("redlimit-demo: cannot listen on {at} (metrics_listen): {err}");
                return ExitCode::from(1);
            }
        },
    };
    println!("redlimit-demo: backend {}", backend_description(&config));
    println!("redlimit-demo: listening on http://{address}");
    for route in &config.routes {
        println!(
            "  GET {}  {} {} per {} (key: {}){}",
            route.path,
            route.algorithm,
            route.limit,
            humantime::format_duration(route.window),
            route.key,
            match (route.shadow, route.max_delay) {
                (true, _) => ", shadow".to_owned(),
                (false, Some(wait)) =>
                    format!(", waits up to {}", humantime::format_duration(wait)),
                (false, None) => String::new(),
            }
        );
    }
    let first = config.routes.first().map_or("/", |r| r.path.as_str());
    println!("try: for i in $(seq 12); do curl -s -i http://{address}{first} | head -n 1; done");
    let service = router.into_make_service_with_connect_info::<SocketAddr>();
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    if let Err(err) = axum::serve(listener, service)
        .with_graceful_shutdown(shutdown)
        .await
    {
        eprintln!("redlimit-demo: {err}");
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}
