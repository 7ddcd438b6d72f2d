//! Backend errors in the log, so a wrong password or an outage is visible, without a line per
//! failing request.

use std::{
    sync::{Mutex, PoisonError},
    time::{Duration, Instant},
};

use crate::{Error, Policy};

/// The same error is logged again only after this long.
const QUIET: Duration = Duration::from_secs(5);
/// Distinct errors remembered; an older one may be logged again early.
const REMEMBERED: usize = 8;

/// Logs each distinct backend error at `warn` through `tracing`, at most once per [`QUIET`].
#[derive(Debug, Default)]
pub(crate) struct ErrorLog {
    logged: Mutex<Vec<(String, Instant)>>,
}

impl ErrorLog {
    /// Logs `error` of a check of `policies` unless the same was logged within [`QUIET`].
    pub(crate) fn report(&self, error: &Error, policies: &[Policy]) {
        // A corrupt key's message names the key, and the key holds the client's identifier,
        // which may be an API key: the log says only that one was found.
        let message = if error.is_corrupt_state() {
            "corrupt limiter state in a client's key".to_owned()
        } else {
            error.to_string()
        };
        let now = Instant::now();
        {
            let mut logged = self.logged.lock().unwrap_or_else(PoisonError::into_inner);
            logged.retain(|(_, at)| now.duration_since(*at) < QUIET);
            if logged.iter().any(|(seen, _)| *seen == message) {
                return;
            }
            if logged.len() == REMEMBERED {
                logged.remove(0);
            }
            logged.push((message.clone(), now));
        }
        let names: Vec<&str> = policies.iter().map(Policy::name).collect();
        tracing::warn!(
            target: "redlimit",
            kind = ?error.kind(),
            policies = %names.join(","),
            "rate-limit check failed, the failure policy answers: {message}"
        );
    }
}
