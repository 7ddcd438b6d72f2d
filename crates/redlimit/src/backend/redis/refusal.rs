//! Which failed calls are safe to send again: those Redis refused without running.

use deadpool_redis::redis::{RedisError, RetryMethod};

/// How often a call that Redis refused before running it is sent again (after 10, 20, 40, …
/// ms; the check's time budget bounds the whole).
pub(super) const REFUSALS_RETRIED: u32 = 5;

/// Whether Redis refused `err`'s call without running it, so that sending it again counts
/// nothing twice: a Cluster's redirect, `CLUSTERDOWN` or `TRYAGAIN` while a primary is
/// replaced, no connection yet to a slot's node. The cluster client sends nothing again by
/// itself (`ClusterManager`): after a lost connection a script may have run, and its checks
/// would count twice.
pub(super) fn refused_before_running(err: &RedisError) -> bool {
    matches!(
        err.retry_method(),
        RetryMethod::MovedRedirect
            | RetryMethod::AskRedirect
            | RetryMethod::WaitAndRetry
            | RetryMethod::RefreshSlotsAndRetry
            | RetryMethod::ReconnectFromInitialConnections
    )
}

#[cfg(test)]
mod tests {
    use deadpool_redis::redis::{self, RedisError};

    use super::refused_before_running;

    /// The error Redis answers with `text` (a RESP error line).
    fn answered(text: &str) -> RedisError {
        let value = redis::parse_redis_value(format!("-{text}\r\n").as_bytes()).expect("RESP");
        value.extract_error().expect_err("an error")
    }

    #[test]
    fn only_what_redis_refused_unrun_is_sent_again() {
        for refused in [
            "MOVED 3999 127.0.0.1:6381",
            "ASK 3999 127.0.0.1:6381",
            "CLUSTERDOWN The cluster is down",
            "TRYAGAIN Multiple keys request during rehashing of slot",
            "LOADING Redis is loading the dataset in memory",
        ] {
            assert!(refused_before_running(&answered(refused)), "{refused}");
        }
        // A script that ran and failed, and a connection lost after sending: either may have
        // written, so neither is sent again.
        assert!(!refused_before_running(&answered(
            "ERR user_script:1: Script attempted to access nonexistent global variable"
        )));
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        assert!(!refused_before_running(&RedisError::from(reset)));
        let eof = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "closed");
        assert!(!refused_before_running(&RedisError::from(eof)));
    }
}
