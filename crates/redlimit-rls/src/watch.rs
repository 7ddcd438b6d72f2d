//! Hot reload: the configuration folder looked at every second, and loaded again when a file in
//! it changed.

use std::{
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use crate::{config::RlsConfig, service::RlsService};

/// How often the configuration folder is looked at.
const EVERY: Duration = Duration::from_secs(1);

/// Reloads the configuration whenever a file in `dir` changes; a configuration that does not
/// load leaves the last good one in force, and says why.
pub async fn watch(dir: PathBuf, service: RlsService) {
    let mut seen = stamp(&dir);
    loop {
        tokio::time::sleep(EVERY).await;
        let now = stamp(&dir);
        if now == seen {
            continue;
        }
        seen = now;
        let loaded = RlsConfig::load_dir(&dir);
        match &loaded {
            Ok(config) => tracing::info!(rules = config.rules(), "configuration reloaded"),
            Err(error) => {
                tracing::warn!(%error, "configuration not reloaded; the last good one stays");
            }
        }
        service.reload(loaded);
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
