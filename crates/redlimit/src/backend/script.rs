//! The check script: every algorithm's Lua in one script, so a check of several policies is one
//! `EVALSHA`. The Lua mirrors `crate::algorithm` line for line.

use deadpool_redis::redis::{Cmd, RedisError};

use crate::{
    Error, ErrorKind, Policy,
    algorithm::{Denial, View},
    policy::MAX_EXACT,
};

pub(crate) const SOURCE: &str = concat!(
    include_str!("../../lua/prelude.lua"),
    include_str!("../../lua/fixed_window.lua"),
    include_str!("../../lua/sliding_window_log.lua"),
    include_str!("../../lua/sliding_window_counter.lua"),
    include_str!("../../lua/token_bucket.lua"),
    include_str!("../../lua/gcra.lua"),
    include_str!("../../lua/check.lua"),
);

/// The error code a script raises for a key it cannot read.
const CORRUPT: &str = "REDLIMIT_CORRUPT";

/// One policy's answer from the script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Answer {
    pub(crate) view: View,
    pub(crate) denial: Option<Denial>,
}

/// The script's SHA-1, as `EVALSHA` names it.
pub(crate) fn sha1() -> String {
    sha1_smol::Sha1::from(SOURCE).digest().to_string()
}

/// One check's `KEYS` and `ARGV`; `now_us` of `None` makes the script read Redis `TIME`.
pub(crate) struct Invocation<'a> {
    pub(crate) policies: &'a [Policy],
    pub(crate) keys: &'a [String],
    pub(crate) cost: u64,
    pub(crate) now_us: Option<u64>,
}

impl Invocation<'_> {
    /// `EVALSHA sha …`: the one command of a check at steady state.
    pub(crate) fn evalsha(&self, sha1: &str) -> Cmd {
        self.command("EVALSHA", sha1)
    }

    /// `EVAL source …`: for a node that lacks the script (`NOSCRIPT`: a restart, a flush, a
    /// freshly promoted replica). It runs the check and caches the script on that very node, which
    /// is the one owning the keys.
    pub(crate) fn eval(&self) -> Cmd {
        self.command("EVAL", SOURCE)
    }

    fn command(&self, name: &str, script: &str) -> Cmd {
        let mut cmd = deadpool_redis::redis::cmd(name);
        cmd.arg(script).arg(self.keys.len()).arg(self.keys);
        match self.now_us {
            Some(now_us) => cmd.arg(now_us),
            None => cmd.arg(""),
        };
        // Any cost above 2^53 is as impossible as 2^53 itself, and stays exact in Lua.
        cmd.arg(self.cost.min(MAX_EXACT));
        for policy in self.policies {
            cmd.arg(&policy.script_args()[..]);
        }
        cmd
    }
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
