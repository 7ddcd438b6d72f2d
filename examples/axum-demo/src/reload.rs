//! Live configuration: the demo's routes swapped in place when its file changes or on `SIGHUP`,
//! without a restart and without dropping connections.

use std::{
    convert::Infallible,
    path::PathBuf,
    sync::{Arc, PoisonError, RwLock},
    task::{Context, Poll},
    time::{Duration, SystemTime},
};

use axum::{Router, extract::Request, response::Response};
use redlimit::Limiter;
use tower::{Service, ServiceExt};

use crate::{Config, app_with};

/// The router in force, swapped whole on a reload: a request runs on the router it started
/// with.
#[derive(Clone)]
pub struct Reloadable {
    current: Arc<RwLock<Router>>,
}

impl std::fmt::Debug for Reloadable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloadable").finish_non_exhaustive()
    }
}

impl Reloadable {
    /// Serves `router` until a reload replaces it.
    pub fn new(router: Router) -> Self {
        Self {
            current: Arc::new(RwLock::new(router)),
        }
    }

    fn router(&self) -> Router {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Watches `path`: on `SIGHUP`, and when its modification time changes (looked at twice a
    /// second), the file is read again; a valid one replaces the routes, keeping the limiter
    /// while the store is the same; an invalid one is refused with a log line and the routes in
    /// force stay.
    pub fn watch(&self, path: PathBuf, config: Config, limiter: Limiter) {
        let this = self.clone();
        tokio::spawn(async move {
            let mut hangup = hangups();
            let mut seen = modified(&path);
            let (mut config, mut limiter) = (config, limiter);
            loop {
                let signalled = tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(500)) => false,
                    () = next(&mut hangup) => true,
                };
                let now = modified(&path);
                if !signalled && now == seen {
                    continue;
                }
                seen = now;
                match this.reload(&path, &config, &limiter) {
                    Ok((new_config, new_limiter)) => {
                        tracing::info!(target: "redlimit_demo", file = %path.display(), "configuration reloaded");
                        (config, limiter) = (new_config, new_limiter);
                    }
                    Err(message) => tracing::warn!(
                        target: "redlimit_demo",
                        file = %path.display(),
                        "reload refused, the running configuration stays: {message}"
                    ),
                }
            }
        });
    }

    /// Reads `path` and swaps in its routes.
    fn reload(
        &self,
        path: &PathBuf,
        old: &Config,
        limiter: &Limiter,
    ) -> Result<(Config, Limiter), String> {
        let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
        let config = Config::parse(&text).map_err(|e| e.to_string())?;
        if config.listen != old.listen || config.metrics_listen != old.metrics_listen {
            return Err("listen and metrics_listen change only with a restart".to_owned());
        }
        let same_store = config.store().ok() == old.store().ok() && config.budget == old.budget;
        let limiter = if same_store {
            limiter.clone()
        } else {
            crate::limiter(&config).map_err(|e| e.to_string())?
        };
        let router = app_with(&config, &limiter).map_err(|e| e.to_string())?;
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = router;
        Ok((config, limiter))
    }
}

fn modified(path: &PathBuf) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

#[cfg(unix)]
type Hangups = Option<tokio::signal::unix::Signal>;
#[cfg(not(unix))]
type Hangups = ();

#[cfg(unix)]
fn hangups() -> Hangups {
    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok()
}
#[cfg(not(unix))]
fn hangups() -> Hangups {}

/// The next `SIGHUP`; never, where there is none.
#[cfg(unix)]
async fn next(hangups: &mut Hangups) {
    match hangups {
        Some(signal) => {
            signal.recv().await;
        }
        None => std::future::pending().await,
    }
}
#[cfg(not(unix))]
async fn next(_: &mut Hangups) {
    std::future::pending().await
}

impl Service<Request> for Reloadable {
    type Response = Response;
    type Error = Infallible;
    type Future = tower::util::Oneshot<Router, Request>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        self.router().oneshot(request)
    }
}
