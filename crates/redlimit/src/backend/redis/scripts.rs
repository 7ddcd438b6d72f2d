//! The scripts, assembled from `lua/`: one small script per algorithm for a request of one
//! policy, and one with every algorithm for any requests, so any check is one `EVALSHA`. The
//! Lua mirrors `crate::algorithm` line for line.

use super::protocol::lua_constants;
use crate::Algorithm;

/// The script for one policy of an algorithm: the prelude, the algorithm's file
/// `lua/$name.lua`, the Lua making its `alone` (`$make`; by default the `alone` of the table
/// `$name_functions()` returns), and the entry for one policy calling it.
macro_rules! one {
    ($name:literal, make = $make:expr) => {
        concat!(
            "local SETTLES = false\n",
            lua_constants!(),
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
            make = concat!("local alone = ", $name, "_functions().alone")
        )
    };
}

/// The Lua source of the script checking one policy of `algorithm`.
const fn one_source(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::FixedWindow => one!(
            "fixed_window",
            make = "local alone = fixed_window_functions().alone"
        ),
        Algorithm::FixedWindowAnchored => one!(
            "fixed_window",
            make = "local _, anchored = fixed_window_functions()\nlocal alone = anchored.alone"
        ),
        Algorithm::SlidingWindowLog => one!("sliding_window_log"),
        Algorithm::SlidingWindowCounter => one!("sliding_window_counter"),
        Algorithm::TokenBucket => one!("token_bucket"),
        Algorithm::Gcra => one!("gcra"),
    }
}

/// The prelude, every algorithm (with its settle when `$settles`), leases, their dispatch by name,
/// overrides and bans, the protocol's readers, then `$entry`.
macro_rules! every {
    ($settles:literal, $entry:literal) => {
        concat!(
            "local SETTLES = ",
            $settles,
            "\n",
            lua_constants!(),
            include_str!("../../../lua/prelude.lua"),
            include_str!("../../../lua/fixed_window.lua"),
            include_str!("../../../lua/sliding_window_log.lua"),
            include_str!("../../../lua/sliding_window_counter.lua"),
            include_str!("../../../lua/token_bucket.lua"),
            include_str!("../../../lua/gcra.lua"),
            include_str!("../../../lua/lease.lua"),
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

/// The Lua source of the script that renews a concurrency lease.
const RENEW: &str = concat!(
    lua_constants!(),
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
    pub(crate) renew: Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Self {
            one: Algorithm::ALL.map(|algorithm| Script::new(one_source(algorithm))),
            check: Script::new(CHECK),
            inspect: Script::new(INSPECT),
            settle: Script::new(SETTLE),
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

/// The Lua source of the script a request runs: the lean script of its algorithm, or the
/// general one (`None`).
pub(crate) fn source_for(lean: Option<Algorithm>) -> &'static str {
    lean.map_or(CHECK, one_source)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lean_request_runs_its_algorithms_script_and_any_other_the_general_one() {
        let scripts = Scripts::new();
        for algorithm in Algorithm::ALL {
            assert_eq!(scripts.of(Some(algorithm)).source, one_source(algorithm));
            assert_eq!(source_for(Some(algorithm)), one_source(algorithm));
        }
        assert_eq!(scripts.of(None).source, CHECK);
        assert_eq!(source_for(None), CHECK);
    }
}
