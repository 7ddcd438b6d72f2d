//! The check script: every algorithm's Lua in one script, so a check of several policies is one
//! `EVALSHA`. The Lua mirrors `crate::algorithm` line for line.

use deadpool_redis::redis::{RedisError, Script};

use crate::{
    Error, ErrorKind, Policy,
    algorithm::{Denial, View},
    policy::MAX_EXACT,
};

const SOURCE: &str = concat!(
    include_str!("../../../../lua/prelude.lua"),
    include_str!("../../../../lua/fixed_window.lua"),
    include_str!("../../../../lua/sliding_window_log.lua"),
    include_str!("../../../../lua/sliding_window_counter.lua"),
    include_str!("../../../../lua/token_bucket.lua"),
    include_str!("../../../../lua/gcra.lua"),
    include_str!("../../../../lua/check.lua"),
);

/// The error code a script raises for a key it cannot read.
const CORRUPT: &str = "REDLIMIT_CORRUPT";

/// One policy's answer from the script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Answer {
    pub(crate) view: View,
    pub(crate) denial: Option<Denial>,
}

pub(crate) fn script() -> Script {
    Script::new(SOURCE)
}

/// Fills the script's `KEYS` and `ARGV`; `now_us` of `None` reads Redis `TIME`.
pub(crate) fn invocation<'a>(
    script: &'a Script,
    policies: &[Policy],
    keys: &[String],
    cost: u64,
    now_us: Option<u64>,
) -> deadpool_redis::redis::ScriptInvocation<'a> {
    let mut call = script.prepare_invoke();
    call.arg(now_us.map_or_else(String::new, |n| n.to_string()));
    // Any cost above 2^53 is as impossible as 2^53 itself, and stays exact in Lua.
    call.arg(cost.min(MAX_EXACT));
    for (policy, key) in policies.iter().zip(keys) {
        call.key(key)
            .arg(policy.algorithm().tag())
            .arg(policy.limit())
            .arg(policy.window_ms())
            .arg(policy.burst());
    }
    call
}

/// Reads the script's reply: four integers per policy.
pub(crate) fn parse(reply: &[i64], policies: usize) -> Result<Vec<Answer>, Error> {
    if reply.len() != policies * 4 {
        return Err(Error::new(
            ErrorKind::Backend,
            format!(
                "script replied {} integers for {policies} policies",
                reply.len()
            ),
        ));
    }
    reply
        .chunks_exact(4)
        .map(|chunk| {
            let &[allowed, remaining, reset_ms, retry] = chunk else {
                unreachable!("chunks of four")
            };
            let unsigned = |n: i64| {
                u64::try_from(n).map_err(|_| {
                    Error::new(ErrorKind::Backend, format!("script replied a negative {n}"))
                })
            };
            let denial = match (allowed, retry) {
                (1, _) => None,
                (_, -2) => Some(Denial::Never),
                (_, ms) => Some(Denial::RetryAfterMs(unsigned(ms)?)),
            };
            Ok(Answer {
                view: View {
                    remaining: unsigned(remaining)?,
                    reset_ms: unsigned(reset_ms)?,
                },
                denial,
            })
        })
        .collect()
}

/// Classifies a Redis error: the script's corrupt-state error, a timeout, or a backend failure.
pub(crate) fn error(err: RedisError) -> Error {
    if err.code() == Some(CORRUPT) {
        let detail = err.detail().unwrap_or_default();
        let detail = detail.split(" script:").next().unwrap_or(detail).to_owned();
        return Error::new(
            ErrorKind::CorruptState,
            format!("corrupt limiter state: {detail}"),
        );
    }
    let kind = if err.is_timeout() {
        ErrorKind::Timeout
    } else {
        ErrorKind::Backend
    };
    Error::new(kind, "redis").with_source(err)
}
