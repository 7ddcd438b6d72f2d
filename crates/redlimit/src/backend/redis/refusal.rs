//! What Redis refused: which failed calls are safe to send again (those refused without
//! running), and what the operator must do about a refusal (its cause, named).

use deadpool_redis::redis::{ErrorKind, RedisError, RetryMethod, ServerErrorKind};

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

/// Whether `err` refuses the library's functions to this client: an ACL without `FCALL` or
/// `FUNCTION LOAD`, or a server (or a proxy: Envoy's says "unsupported command") that does not
/// know them. Checks then go as scripts.
pub(super) fn refuses_functions(err: &RedisError) -> bool {
    let detail = err.detail().unwrap_or_default();
    match err.kind() {
        ErrorKind::Server(ServerErrorKind::NoPerm) => quoted(detail)
            .is_some_and(|command| command == "fcall" || command.starts_with("function")),
        _ => {
            let detail = detail.to_ascii_lowercase();
            ["unknown command", "unsupported command", "not supported"]
                .iter()
                .any(|refusal| detail.contains(refusal))
        }
    }
}

/// Whether `err` is a node's answer that it lacks the library's function (a restart without
/// persistence, a `FUNCTION FLUSH`, a node new to the Cluster): it is loaded, and called again.
pub(super) fn function_missing(err: &RedisError) -> bool {
    err.detail()
        .is_some_and(|detail| detail.starts_with("Function not found"))
}

/// Whether Redis closes the connection after `err`: it does after any protocol error (the
/// refusal of an unauthenticated client's long command among them), so the next call takes a
/// fresh connection instead of failing on a broken pipe.
pub(super) fn closes_connection(err: &RedisError) -> bool {
    err.is_unrecoverable_error()
        || err
            .detail()
            .is_some_and(|detail| detail.starts_with("Protocol error"))
}

/// What the operator must do about `err`, when Redis refused the call for a reason of its
/// setup rather than of the call: `None` for any other failure. Named whatever the call's arity:
/// Redis 7 answers a client that has not authenticated with `NOAUTH` for a short command and a
/// protocol error about an "unauthenticated multibulk length" for one of more than ten
/// arguments, and both are a missing password.
pub(super) fn cause(err: &RedisError) -> Option<String> {
    let detail = err.detail().unwrap_or_default();
    let code = err.code().unwrap_or_default();
    let cause = match err.kind() {
        ErrorKind::AuthenticationFailed => {
            "authentication failed: wrong user name or password in the URL".to_owned()
        }
        _ if code == "NOAUTH" || detail.contains("unauthenticated") => {
            "authentication required: the server asks for a password and none was given \
             (`redis://user:password@host`)"
                .to_owned()
        }
        _ if code == "WRONGPASS" => {
            "authentication failed: wrong user name or password in the URL".to_owned()
        }
        ErrorKind::Server(ServerErrorKind::NoPerm) => match quoted(detail) {
            Some(command) => format!(
                "ACL denied: the user may not run `{command}` (grant it: ACL SETUSER … \
                 +{command})"
            ),
            None => "ACL denied: the user may not use the limiter's keys or channel (grant \
                     them: ACL SETUSER … ~prefix:* &prefix:*)"
                .to_owned(),
        },
        _ if code == "OOM" => "out of memory: Redis is at maxmemory and may evict nothing \
                               (raise maxmemory, or choose an eviction policy)"
            .to_owned(),
        _ if code == "BUSY" => "busy: a script or function ran past Redis's script time \
                                limit (FUNCTION KILL or SCRIPT KILL, or wait)"
            .to_owned(),
        _ if detail.contains("killed by user") => {
            "a check was killed by FUNCTION KILL or SCRIPT KILL".to_owned()
        }
        ErrorKind::Server(ServerErrorKind::ReadOnly) => "read-only: the URL names a replica; \
                                                         point it at the primary"
            .to_owned(),
        ErrorKind::Server(ServerErrorKind::ClusterDown) => {
            "cluster down: some slots are served by no primary".to_owned()
        }
        ErrorKind::Server(ServerErrorKind::MasterDown) => {
            "primary down: the replica lost its primary".to_owned()
        }
        ErrorKind::Server(ServerErrorKind::BusyLoading) => {
            "loading: Redis is loading its dataset into memory".to_owned()
        }
        _ => return None,
    };
    Some(cause)
}

/// The first word in single quotes in `detail`: the command of an ACL refusal ("User x has no
/// permissions to run the 'evalsha' command"); only a command's letters are taken.
fn quoted(detail: &str) -> Option<&str> {
    let (_, rest) = detail.split_once('\'')?;
    let (word, _) = rest.split_once('\'')?;
    let command = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '|' || c == '-' || c == '_');
    command.then_some(word)
}

#[cfg(test)]
mod tests {
    use deadpool_redis::redis::{self, RedisError};

    use super::{cause, function_missing, refused_before_running, refuses_functions};

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

    #[test]
    fn every_refusal_of_the_setup_names_what_to_do() {
        for (refusal, named) in [
            ("NOAUTH Authentication required.", "authentication required"),
            (
                "ERR Protocol error: unauthenticated multibulk length",
                "authentication required",
            ),
            (
                "WRONGPASS invalid username-password pair or user is disabled.",
                "authentication failed",
            ),
            (
                "NOPERM User limited has no permissions to run the 'evalsha' command",
                "may not run `evalsha`",
            ),
            (
                "NOPERM No permissions to access a key",
                "the limiter's keys",
            ),
            (
                "OOM command not allowed when used memory > 'maxmemory'.",
                "out of memory",
            ),
            ("BUSY Redis is busy running a script.", "FUNCTION KILL"),
            (
                "ERR Error running script (call to f_1): Script killed by user with SCRIPT KILL...",
                "killed by",
            ),
            (
                "ERR Script killed by user with FUNCTION KILL...",
                "killed by FUNCTION KILL",
            ),
            (
                "READONLY You can't write against a read only replica.",
                "primary",
            ),
            ("CLUSTERDOWN The cluster is down", "cluster down"),
            ("LOADING Redis is loading the dataset in memory", "loading"),
        ] {
            let said = cause(&answered(refusal)).unwrap_or_else(|| panic!("{refusal}"));
            assert!(said.contains(named), "{refusal}: {said}");
        }
        assert_eq!(cause(&answered("ERR user_script:1: something")), None);
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        assert_eq!(cause(&RedisError::from(reset)), None);
    }

    #[test]
    fn functions_refused_are_told_from_a_function_missing_and_from_other_failures() {
        for refused in [
            "NOPERM User limited has no permissions to run the 'fcall' command",
            "NOPERM User limited has no permissions to run the 'function|load' command",
            "ERR unknown command 'FCALL', with args beginning with: 'redlimit_0123_fw' ",
            "ERR unsupported command 'fcall'",
        ] {
            assert!(refuses_functions(&answered(refused)), "{refused}");
            assert!(!function_missing(&answered(refused)), "{refused}");
        }
        for other in [
            "ERR Function not found",
            "NOPERM No permissions to access a key",
            "BUSY Redis is busy running a script.",
            "CLUSTERDOWN The cluster is down",
        ] {
            assert!(!refuses_functions(&answered(other)), "{other}");
        }
        assert!(function_missing(&answered("ERR Function not found")));
    }
}
