//! The check scripts: one small script per algorithm for a check of one policy, and one with
//! every algorithm for several policies together, so any check is one `EVALSHA`. The Lua mirrors
//! `crate::algorithm` line for line.

use deadpool_redis::redis::{Cmd, RedisError};

use crate::{
    Algorithm, Error, ErrorKind, Policy,
    algorithm::{Denial, View},
    policy::MAX_EXACT,
};

/// The script for one policy of an algorithm: the prelude, that algorithm's file, and the entry
/// for one policy calling its `decide` and `take`.
macro_rules! one {
    ($file:literal, $decide:literal, $take:literal) => {
        concat!(
            include_str!("../../lua/prelude.lua"),
            include_str!(concat!("../../lua/", $file)),
            "local decide, take = ",
            $decide,
            ", ",
            $take,
            "\n",
            include_str!("../../lua/one.lua"),
        )
    };
}

/// The Lua source of the script checking one policy of `algorithm`.
pub(crate) const fn one_source(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::FixedWindow => one!("fixed_window.lua", "fixed_window", "fixed_window_take"),
        Algorithm::FixedWindowAnchored => one!(
            "fixed_window.lua",
            "fixed_window_anchored",
            "fixed_window_take"
        ),
        Algorithm::SlidingWindowLog => one!(
            "sliding_window_log.lua",
            "sliding_window_log",
            "sliding_window_log_take"
        ),
        Algorithm::SlidingWindowCounter => one!(
            "sliding_window_counter.lua",
            "sliding_window_counter",
            "sliding_window_counter_take"
        ),
        Algorithm::TokenBucket => one!("token_bucket.lua", "token_bucket", "token_bucket_take"),
        Algorithm::Gcra => one!("gcra.lua", "gcra", "gcra_take"),
    }
}

/// The prelude, every algorithm, and their dispatch by tag, then `$marks` (how tags are read:
/// `marks.lua`, or `unmarked.lua` where no policy is marked), then `$entry`.
macro_rules! every {
    ($marks:literal, $entry:literal) => {
        concat!(
            include_str!("../../lua/prelude.lua"),
            include_str!("../../lua/fixed_window.lua"),
            include_str!("../../lua/sliding_window_log.lua"),
            include_str!("../../lua/sliding_window_counter.lua"),
            include_str!("../../lua/token_bucket.lua"),
            include_str!("../../lua/gcra.lua"),
            include_str!("../../lua/dispatch.lua"),
            include_str!(concat!("../../lua/", $marks)),
            include_str!(concat!("../../lua/", $entry)),
        )
    };
}

/// The Lua source of the script checking several policies at once.
pub(crate) const SEVERAL: &str = every!("marks.lua", "several.lua");

/// The same, for policies none of which takes overrides or bans.
const SEVERAL_UNMARKED: &str = every!("unmarked.lua", "several.lua");

/// The Lua source of the script inspecting one policy's key without writing.
const INSPECT: &str = every!("marks.lua", "inspect.lua");

/// The Lua source of the script giving back what a reservation took.
const REFUND: &str = concat!(
    include_str!("../../lua/prelude.lua"),
    include_str!("../../lua/marks.lua"),
    include_str!("../../lua/refund.lua")
);

/// The last argument of a check that is a reservation: several.lua replies the time it took.
pub(crate) const RESERVE: &str = "r";

/// The error code a script raises for a key it cannot read.
const CORRUPT: &str = "REDLIMIT_CORRUPT";
/// Redis's error code for a command on a key of another type.
const WRONGTYPE: &str = "WRONGTYPE";

/// One policy's answer from the script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Answer {
    pub(crate) view: View,
    pub(crate) denial: Option<Denial>,
    /// Delay mode: how long an admitted request waits for its slot, in milliseconds.
    pub(crate) delay_ms: u64,
    /// Denied by a ban.
    pub(crate) banned: bool,
}

impl Answer {
    pub(crate) const fn denied(view: View, denial: Denial) -> Self {
        Self {
            view,
            denial: Some(denial),
            delay_ms: 0,
            banned: false,
        }
    }

    /// Denied by a ban that ends in `left_ms`.
    pub(crate) const fn banned(view: View, left_ms: u64) -> Self {
        Self {
            view,
            denial: Some(Denial::RetryAfterMs(left_ms)),
            delay_ms: 0,
            banned: true,
        }
    }

    pub(crate) const fn allowed(view: View, delay_ms: u64) -> Self {
        Self {
            view,
            denial: None,
            delay_ms,
            banned: false,
        }
    }
}

/// A script's source and its SHA-1, as `EVALSHA` names it.
#[derive(Debug)]
pub(crate) struct Script {
    source: &'static str,
    sha1: String,
}

impl Script {
    fn new(source: &'static str) -> Self {
        Self {
            source,
            sha1: sha1_smol::Sha1::from(source).digest().to_string(),
        }
    }
}

/// The Lua source of the script that acquires a concurrency lease.
const ACQUIRE: &str = concat!(
    include_str!("../../lua/prelude.lua"),
    include_str!("../../lua/acquire.lua")
);

/// The Lua source of the script that renews a concurrency lease.
const RENEW: &str = concat!(
    include_str!("../../lua/prelude.lua"),
    include_str!("../../lua/renew.lua")
);

/// The Lua source of the script checking one GCRA policy in delay mode.
const GCRA_DELAY: &str = one!("gcra.lua", "gcra_delay", "gcra_take");

/// Every script a backend may send, hashed once.
#[derive(Debug)]
pub(crate) struct Scripts {
    /// In the order of [`Algorithm::ALL`].
    one: [Script; Algorithm::ALL.len()],
    gcra_delay: Script,
    pub(crate) acquire: Script,
    pub(crate) renew: Script,
    several: Script,
    several_unmarked: Script,
    inspect: Script,
    pub(crate) refund: Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Self {
            one: Algorithm::ALL.map(|algorithm| Script::new(one_source(algorithm))),
            gcra_delay: Script::new(GCRA_DELAY),
            acquire: Script::new(ACQUIRE),
            renew: Script::new(RENEW),
            several: Script::new(SEVERAL),
            several_unmarked: Script::new(SEVERAL_UNMARKED),
            inspect: Script::new(INSPECT),
            refund: Script::new(REFUND),
        }
    }

    /// The script that inspects one policy's key without writing.
    pub(crate) fn inspect(&self) -> &Script {
        &self.inspect
    }

    /// The script for the check `call`.
    pub(crate) fn of(&self, call: &Invocation<'_>) -> &Script {
        match Which::of(call.policies, call.is_reservation()) {
            Which::One(at) => &self.one[at],
            Which::GcraDelay => &self.gcra_delay,
            Which::Several => &self.several,
            Which::SeveralUnmarked => &self.several_unmarked,
        }
    }
}

/// Which script a check runs.
#[derive(Debug, Clone, Copy)]
enum Which {
    /// The lean one of a single policy's algorithm, by its place in [`Algorithm::ALL`].
    One(usize),
    GcraDelay,
    /// Several policies, of which some are marked.
    Several,
    SeveralUnmarked,
}

impl Which {
    /// The lean script for a single policy, unless the check is a `reservation`; for several,
    /// the one that reads marks only if a policy is marked.
    fn of(policies: &[Policy], reservation: bool) -> Self {
        if policies.iter().any(Policy::needs_several) {
            return Self::Several;
        }
        match policies {
            _ if reservation => Self::SeveralUnmarked,
            [policy] if policy.max_delay_ms() > 0 => Self::GcraDelay,
            [policy] => Algorithm::ALL
                .iter()
                .position(|algorithm| *algorithm == policy.algorithm())
                .map_or(Self::SeveralUnmarked, Self::One),
            _ => Self::SeveralUnmarked,
        }
    }

    const fn source(self) -> &'static str {
        match self {
            Self::One(at) => one_source(Algorithm::ALL[at]),
            Self::GcraDelay => GCRA_DELAY,
            Self::Several => SEVERAL,
            Self::SeveralUnmarked => SEVERAL_UNMARKED,
        }
    }
}

/// The Lua source of the script a check of `policies` runs.
pub(crate) fn source_of(policies: &[Policy]) -> &'static str {
    Which::of(policies, false).source()
}

/// One check's `KEYS` and `ARGV`; `now_us` of `None` makes the script read Redis `TIME`.
pub(crate) struct Invocation<'a> {
    pub(crate) policies: &'a [Policy],
    pub(crate) keys: &'a [String],
    pub(crate) cost: u64,
    pub(crate) now_us: Option<u64>,
    /// Arguments after the policies': a lease's TTL and id.
    pub(crate) extra: &'a [String],
}

impl<'a> Invocation<'a> {
    /// A command about one `key` of `policy` (a key name or a pattern), at Redis's time.
    pub(crate) fn of_key(policy: &'a Policy, key: &'a String) -> Self {
        Self::of_keys(policy, std::slice::from_ref(key))
    }

    /// A command about `keys` of `policy`, all in one slot, at Redis's time.
    pub(crate) fn of_keys(policy: &'a Policy, keys: &'a [String]) -> Self {
        Self {
            policies: std::slice::from_ref(policy),
            keys,
            cost: 1,
            now_us: None,
            extra: &[],
        }
    }

    /// Whether the check is a reservation, whose reply ends with the time it was taken at.
    pub(crate) fn is_reservation(&self) -> bool {
        self.extra.last().is_some_and(|last| last == RESERVE)
    }

    /// `EVALSHA sha …`: the one command of a check at steady state.
    pub(crate) fn evalsha(&self, script: &Script) -> Cmd {
        self.command("EVALSHA", &script.sha1)
    }

    /// `EVAL source …`: for a node that lacks the script (`NOSCRIPT`: a restart, a flush, a
    /// freshly promoted replica). It runs the check and caches the script on that very node, which
    /// is the one owning the keys.
    pub(crate) fn eval(&self, script: &Script) -> Cmd {
        self.command("EVAL", script.source)
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
            cmd.arg(policy.script_args());
        }
        cmd.arg(self.extra);
        cmd
    }

    /// Whether `err` says a key of this check holds corrupt state.
    pub(crate) fn error_is_corrupt(&self, err: &RedisError) -> bool {
        matches!(err.code(), Some(CORRUPT | WRONGTYPE))
    }

    /// Classifies a Redis error of this check: corrupt state (the script's own error, or a key
    /// of the wrong type), a timeout, or a backend failure.
    pub(crate) fn error(&self, err: RedisError) -> Error {
        if err.code() == Some(CORRUPT) {
            let detail = err.detail().unwrap_or_default();
            let detail = detail.split(" script:").next().unwrap_or(detail).to_owned();
            return Error::new(
                ErrorKind::CorruptState,
                format!("corrupt limiter state: {detail}"),
            );
        }
        if err.code() == Some(WRONGTYPE) {
            return Error::new(
                ErrorKind::CorruptState,
                format!(
                    "corrupt limiter state: {} holds the wrong type of value",
                    self.keys.join(" or ")
                ),
            );
        }
        let kind = if err.is_timeout() {
            ErrorKind::Timeout
        } else {
            ErrorKind::Backend
        };
        Error::new(kind, "redis").with_source(err)
    }
}

/// What the inspect script read: the decision of its cost (the quota as it is, nothing
/// consumed), the key's time to live, and its state as field, value pairs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Inspected {
    pub(crate) answer: Answer,
    pub(crate) ttl_ms: Option<u64>,
    pub(crate) state: Vec<(String, String)>,
    /// The limit in force and the key read, when an override named others than the policy's.
    pub(crate) overridden: Option<(u64, String)>,
}

/// Reads the inspect script's reply.
pub(crate) fn parse_inspected(
    reply: (i64, i64, i64, i64, i64, Vec<String>, i64, String),
    key: &str,
) -> Result<Inspected, Error> {
    let (allowed, remaining, reset, retry, pttl, state, limit, read) = reply;
    let answer = parse(&[allowed, remaining, reset, retry], 1)?.remove(0);
    let mut fields = state.into_iter();
    let mut pairs = Vec::new();
    while let (Some(field), Some(value)) = (fields.next(), fields.next()) {
        pairs.push((field, value));
    }
    Ok(Inspected {
        answer,
        ttl_ms: u64::try_from(pttl).ok(),
        state: pairs,
        overridden: (read != key).then(|| (u64::try_from(limit).unwrap_or(0), read)),
    })
}

/// A check's reply, read.
pub(crate) struct Reply {
    /// One per policy.
    pub(crate) answers: Vec<Answer>,
    /// The limit in force for each policy that takes overrides, in order.
    pub(crate) limits: Vec<u64>,
    /// A reservation's time.
    pub(crate) taken_at_us: Option<u64>,
}

/// Reads a check's reply: four integers per policy, then the limit in force of each policy
/// that takes overrides, then for a reservation the time it was taken at.
pub(crate) fn parse_check(reply: &[i64], call: &Invocation<'_>) -> Result<Reply, Error> {
    let (reply, taken_at_us) = match reply.split_last() {
        Some((&at, rest)) if call.is_reservation() => (rest, u64::try_from(at).ok()),
        _ => (reply, None),
    };
    let overridable = call.policies.iter().filter(|p| p.takes_overrides()).count();
    let (answers, limits) = reply.split_at(reply.len().saturating_sub(overridable));
    Ok(Reply {
        answers: parse(answers, call.policies.len())?,
        limits: limits
            .iter()
            .map(|&l| u64::try_from(l).unwrap_or(0))
            .collect(),
        taken_at_us,
    })
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
            let view = View {
                remaining: unsigned(remaining)?,
                reset_ms: unsigned(reset_ms)?,
            };
            // Admitted, retry is -1, or in delay mode the wait for the request's slot; 2 is a
            // ban's denial.
            Ok(match (allowed, retry) {
                (1, wait) => Answer::allowed(view, u64::try_from(wait).unwrap_or(0)),
                (2, ms) => Answer::banned(view, unsigned(ms)?),
                (_, -2) => Answer::denied(view, Denial::Never),
                (_, ms) => Answer::denied(view, Denial::RetryAfterMs(unsigned(ms)?)),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::Ban;

    fn policy(name: &str, marked: bool) -> Policy {
        let builder = Policy::builder(name, Algorithm::FixedWindow)
            .limit(10)
            .window(Duration::from_secs(60));
        let builder = if marked {
            builder.overrides(true)
        } else {
            builder
        };
        builder.build().expect("a valid policy")
    }

    fn source<'a>(scripts: &'a Scripts, policies: &[Policy], extra: &[String]) -> &'a str {
        let call = Invocation {
            policies,
            keys: &[],
            cost: 1,
            now_us: None,
            extra,
        };
        scripts.of(&call).source
    }

    #[test]
    fn only_checks_of_marked_policies_carry_the_marks_code() {
        let scripts = Scripts::new();
        let (a, b) = (policy("a", false), policy("b", false));
        let reserve = [RESERVE.to_owned()];
        assert_eq!(
            source(&scripts, &[a.clone(), b.clone()], &[]),
            SEVERAL_UNMARKED
        );
        assert_eq!(
            source(&scripts, std::slice::from_ref(&a), &reserve),
            SEVERAL_UNMARKED
        );
        assert_eq!(
            source(&scripts, std::slice::from_ref(&a), &[]),
            one_source(Algorithm::FixedWindow)
        );
        assert_eq!(
            source(&scripts, &[a.clone(), policy("m", true)], &[]),
            SEVERAL
        );
        let banning = Policy::builder("ban", Algorithm::FixedWindow)
            .limit(10)
            .window(Duration::from_secs(60))
            .ban(Ban::new(
                3,
                Duration::from_secs(60),
                Duration::from_secs(600),
            ))
            .build()
            .expect("a valid policy");
        assert_eq!(source(&scripts, &[banning], &reserve), SEVERAL);
        assert!(!SEVERAL_UNMARKED.contains("load_marks"));
        assert_eq!(source_of(&[a.clone(), b]), SEVERAL_UNMARKED);
        assert_eq!(source_of(&[a]), Algorithm::FixedWindow.script());
    }
}
