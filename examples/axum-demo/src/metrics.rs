//! `GET /metrics`: the library's series in the Prometheus text format.

use std::time::Duration;

use axum::{Router, routing::get};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::config::METRICS_PATH;

/// Buckets of `redlimit_check_duration_seconds`: a Redis round trip on a LAN is well under a
/// millisecond, and a check never waits past its budget (tens of milliseconds).
const CHECK_BUCKETS: [f64; 11] = [
    0.000_25, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0,
];

/// Installs the process's Prometheus recorder. Call it before building the app: a guard
/// registers its series with the recorder in force when it is built.
///
/// # Errors
/// A recorder is already installed.
pub fn install_metrics() -> Result<PrometheusHandle, String> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full("redlimit_check_duration_seconds".to_owned()),
            &CHECK_BUCKETS,
        )
        .and_then(PrometheusBuilder::install_recorder)
        .map_err(|e| format!("metrics: {e}"))?;
    // Histograms keep samples until upkeep folds them in; without the exporter's own HTTP
    // listener, that is the application's job.
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(5));
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

/// A router serving `GET /metrics` from `handle`.
pub fn metrics_router(handle: PrometheusHandle) -> Router {
    Router::new().route(
        METRICS_PATH,
        get(move || std::future::ready(handle.render())),
    )
}
