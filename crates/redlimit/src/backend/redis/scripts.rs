//! The scripts, assembled from `lua/`: one small script per algorithm for a request of one
//! policy, and one with every algorithm for any requests, so any check is one `EVALSHA`. The
//! Lua mirrors `crate::algorithm` line for line.

use super::protocol::Request;
use crate::{Algorithm, Policy};

/// The script for one policy of an algorithm: the prelude, the algorithm's file
/// `lua/$name.lua`, the Lua making its `alone` (`$make`; by default `$name_functions()`
/// returning it fourth), and the entry for one policy calling it.
macro_rules! one {
    ($name:literal, make = $make:expr) => {
        concat!(
            "local SETTLES = false\n",
            include_str!("../../../lua/prelude.lua"),
            include_str!(concat!("../../../lua/", $name, ".lua")),
            $make,
            "\n",
            include_str!("../../../lua/one.lua"),
        )
    };
    ($name:literal) => {
        one!(
            $name,
            make = concat!("local _, _, _, alone = ", $name, "_functions()")
        )
    };
}

/// The Lua source of the script checking one policy of `algorithm`.
const fn one_source(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::FixedWindow => one!(
            "fixed_window",
            make = "local _, _, _, _, _, _, alone = fixed_window_functions()"
        ),
        Algorithm::FixedWindowAnchored => one!(
            "fixed_window",
            make = "local _, _, _, _, _, _, _, _, alone = fixed_window_functions()"
        ),
        Algorithm::SlidingWindowLog => one!("sliding_window_log"),
        Algorithm::SlidingWindowCounter => one!("sliding_window_counter"),
        Algorithm::TokenBucket => one!("token_bucket"),
        Algorithm::Gcra => one!("gcra"),
    }
}

/// The prelude, every algorithm (with its settle when `$settles`) and their dispatch by name,
/// overrides and bans, the protocol's readers, then `$entry`.
macro_rules! every {
    ($settles:literal, $entry:literal) => {
        concat!(
            "local SETTLES = ",
            $settles,
            "\n",
            include_str!("../../../lua/prelude.lua"),
            include_str!("../../../lua/fixed_window.lua"),
            include_str!("../../../lua/sliding_window_log.lua"),
            include_str!("../../../lua/sliding_window_counter.lua"),
            include_str!("../../../lua/token_bucket.lua"),
            include_str!("../../../lua/gcra.lua"),
            include_str!("../../../lua/dispatch.lua"),
            include_str!("../../../lua/marks.lua"),
            include_str!("../../../lua/protocol.lua"),
            include_str!(concat!("../../../lua/", $entry)),
        )
    };
}

/// The Lua source of the script checking any requests of any policies.
pub(crate) const CHECK: &str = every!("false", "check.lua");

/// The Lua source of the script inspecting one policy's key without writing.
const INSPECT: &str = every!("false", "inspect.lua");

/// The Lua source of the script giving back what reservations took.
const SETTLE: &str = every!("true", "settle.lua");

/// The Lua source of the script that acquires a concurrency lease.
const ACQUIRE: &str = concat!(
    include_str!("../../../lua/prelude.lua"),
    include_str!("../../../lua/acquire.lua")
);

/// The Lua source of the script that renews a concurrency lease.
const RENEW: &str = concat!(
    include_str!("../../../lua/prelude.lua"),
    include_str!("../../../lua/renew.lua")
);

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

    pub(crate) fn source(&self) -> &'static str {
        self.source
    }

    pub(crate) fn sha1(&self) -> &str {
        &self.sha1
    }
}

/// Every script a backend may send, hashed once.
#[derive(Debug)]
pub(crate) struct Scripts {
    /// In the order of [`Algorithm::ALL`].
    one: [Script; Algorithm::ALL.len()],
    check: Script,
    pub(crate) inspect: Script,
    pub(crate) settle: Script,
    pub(crate) acquire: Script,
    pub(crate) renew: Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Self {
            one: Algorithm::ALL.map(|algorithm| Script::new(one_source(algorithm))),
            check: Script::new(CHECK),
            inspect: Script::new(INSPECT),
            settle: Script::new(SETTLE),
            acquire: Script::new(ACQUIRE),
            renew: Script::new(RENEW),
        }
    }

    /// The lean script of `algorithm`'s one policy, or (`None`) the one that reads any requests.
    pub(crate) fn of(&self, lean: Option<Algorithm>) -> &Script {
        lean.map_or(&self.check, |algorithm| &self.one[position(algorithm)])
    }
}

fn position(algorithm: Algorithm) -> usize {
    Algorithm::ALL
        .iter()
        .position(|a| *a == algorithm)
        .unwrap_or_else(|| unreachable!("every algorithm is in ALL"))
}

/// The Lua source of the script a check of `policies` for one client runs.
pub(crate) fn source_of(policies: &[Policy]) -> &'static str {
    match policies {
        [_] => Request::new(policies, "").lean().map_or(CHECK, one_source),
        _ => CHECK,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::Ban;

    fn policy(name: &str, algorithm: Algorithm) -> Policy {
        Policy::builder(name, algorithm)
            .limit(10)
            .window(Duration::from_secs(60))
            .build()
            .expect("a valid policy")
    }

    #[test]
    fn a_lone_policy_without_overrides_or_bans_runs_its_algorithms_lean_script() {
        let scripts = Scripts::new();
        let (a, b) = (
            policy("a", Algorithm::FixedWindow),
            policy("b", Algorithm::Gcra),
        );
        let one = [a.clone()];
        let lone = Request::new(&one, "c");
        assert_eq!(
            scripts.of(lone.lean()).source,
            one_source(Algorithm::FixedWindow)
        );
        let reserved = Request {
            reserve: true,
            once: Some(("id", 1_000)),
            ..lone
        };
        assert_eq!(
            scripts.of(reserved.lean()).source,
            one_source(Algorithm::FixedWindow),
            "ids and reservations do not need the general script"
        );
        let two = [a.clone(), b];
        assert_eq!(scripts.of(Request::new(&two, "c").lean()).source, CHECK);
        let banning = [Policy::builder("ban", Algorithm::FixedWindow)
            .limit(10)
            .window(Duration::from_secs(60))
            .ban(Ban::new(
                3,
                Duration::from_secs(60),
                Duration::from_secs(600),
            ))
            .build()
            .expect("a valid policy")];
        assert_eq!(scripts.of(Request::new(&banning, "c").lean()).source, CHECK);
        assert_eq!(source_of(&two), CHECK);
        assert_eq!(source_of(&one), one_source(Algorithm::FixedWindow));
    }
}
