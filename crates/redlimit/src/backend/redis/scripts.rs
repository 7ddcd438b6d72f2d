//! The scripts, assembled from `lua/`: one small script per algorithm for a request of one
//! policy, and one with every algorithm for any requests, so any check is one `EVALSHA`; and
//! the same checks as one function library, loaded once (`FUNCTION LOAD`), each check then one
//! `FCALL`. The Lua mirrors `crate::algorithm` line for line.

use super::protocol::lua_constants;
use crate::Algorithm;

/// The script for one policy of an algorithm: the prelude, the algorithm's file
/// `lua/$name.lua`, the Lua making its functions (`$make`; by default the table
/// `$name_functions()` returns), and the entry for one policy calling its `alone`, then its
/// `flush` where it keeps writes to the call's end.
macro_rules! one {
    ($name:literal, make = $make:expr) => {
        concat!(
            "local SETTLES = false\n",
            lua_constants!(),
            include_str!("../../../lua/prelude.lua"),
            include_str!(concat!("../../../lua/", $name, ".lua")),
            "local fns = ",
            $make,
            "\nlocal alone, flush_writes = fns.alone, fns.flush or function() end\n",
            include_str!("../../../lua/one.lua"),
        )
    };
    ($name:literal) => {
        one!($name, make = concat!($name, "_functions()"))
    };
}

/// The Lua source of the script checking one policy of `algorithm`.
const fn one_source(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::FixedWindow => one!("fixed_window", make = "fixed_window_functions()"),
        Algorithm::FixedWindowAnchored => {
            one!("fixed_window", make = "select(2, fixed_window_functions())")
        }
        Algorithm::SlidingWindowLog => one!("sliding_window_log"),
        Algorithm::SlidingWindowCounter => one!("sliding_window_counter"),
        Algorithm::TokenBucket => one!("token_bucket"),
        Algorithm::Gcra => one!("gcra"),
    }
}

/// The prelude, every algorithm (with its settle when `$settles`), leases, their dispatch by name,
/// overrides and bans, the protocol's readers, then `$tail`: an entry's file, or the library's.
macro_rules! every {
    ($settles:literal, $($tail:expr),+ $(,)?) => {
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
            include_str!("../../../lua/groups.lua"),
            include_str!("../../../lua/dispatch.lua"),
            include_str!("../../../lua/marks.lua"),
            include_str!("../../../lua/protocol.lua"),
            $($tail),+
        )
    };
}

/// The Lua source of the script checking any requests of any policies.
pub(crate) const CHECK: &str = every!("false", include_str!("../../../lua/check.lua"));

/// The body of the function library (see [`Library`]): everything a check needs, made once at
/// the library's first call by `make`, and its entries, `check` (`check.lua`'s body) and `lean`
/// (`one.lua`'s, for one policy of the algorithm named).
const LIBRARY_BODY: &str = every!(
    "false",
    include_str!("../../../lua/library.lua"),
    "local function check(KEYS, ARGV)\n",
    include_str!("../../../lua/check.lua"),
    "\nend\nlocal function lean(KEYS, ARGV, name)\nlocal alone = algorithm(name).alone\n",
    include_str!("../../../lua/one.lua"),
    "\nend\nreturn { fresh = fresh_call, check = check, lean = lean }\n",
);

/// The Lua source of the script inspecting one policy's key without writing.
const INSPECT: &str = every!("false", include_str!("../../../lua/inspect.lua"));

/// The Lua source of the script giving back what reservations took.
const SETTLE: &str = every!("true", include_str!("../../../lua/settle.lua"));

/// The Lua source of the script that renews a concurrency lease.
const RENEW: &str = concat!(
    lua_constants!(),
    include_str!("../../../lua/prelude.lua"),
    include_str!("../../../lua/renew.lua")
);

/// A script's source and its SHA-1, as `EVALSHA` names it, and the function of the library
/// that runs the same check, if one does.
#[derive(Debug)]
pub(crate) struct Script {
    source: &'static str,
    sha1: String,
    function: Option<String>,
}

impl Script {
    fn new(source: &'static str) -> Self {
        Self {
            source,
            sha1: sha1_smol::Sha1::from(source).digest().to_string(),
            function: None,
        }
    }

    /// This script, whose check `library`'s function `entry` runs too.
    fn in_library(mut self, library: &Library, entry: &str) -> Self {
        self.function = Some(format!("{}_{entry}", library.name));
        self
    }

    /// The library function running this script's check, if one does.
    pub(crate) fn function(&self) -> Option<&str> {
        self.function.as_deref()
    }

    pub(crate) fn source(&self) -> &'static str {
        self.source
    }

    pub(crate) fn sha1(&self) -> &str {
        &self.sha1
    }
}

/// The checks' scripts as one function library, for `FUNCTION LOAD`: named after a hash of its
/// source, so that versions running side by side (a rolling upgrade) each load their own instead
/// of replacing each other's. Its functions and what they keep (`make`) are made once per
/// server, at the first call, where a script makes them again at every call: Redis instructions
/// per fixed-window decision in batches of 64, 16,258 by `EVALSHA` -> 14,448 by `FCALL`, and
/// 111,424 -> 74,126 for a check alone (callgrind on redis-server, `EVALSHA` and `FCALL` calls
/// of one build interleaved).
#[derive(Debug)]
pub(crate) struct Library {
    name: String,
    source: String,
}

impl Library {
    fn new() -> Self {
        let hash = sha1_smol::Sha1::from(LIBRARY_BODY).digest().to_string();
        let name = format!("redlimit_{}", &hash[..16]);
        // Only the redis API is at hand while the library loads (no math, no ipairs): each
        // function makes everything else at its first call, and starts each call fresh.
        let mut source = format!(
            "#!lua name={name}\nlocal api = nil\nlocal function make()\n{LIBRARY_BODY}end\n"
        );
        let register = |entry: &str, call: &str| {
            format!(
                "redis.register_function('{name}_{entry}', function(KEYS, ARGV)\n  \
                 api = api or make()\n  api.fresh()\n  return {call}\nend)\n"
            )
        };
        source += &register("check", "api.check(KEYS, ARGV)");
        for algorithm in Algorithm::ALL {
            let tag = algorithm.tag();
            source += &register(tag, &format!("api.lean(KEYS, ARGV, '{tag}')"));
        }
        Self { name, source }
    }

    /// Its source, for `FUNCTION LOAD`.
    pub(crate) fn source(&self) -> &str {
        &self.source
    }
}

/// Every script a backend may send, hashed once, and the library of the checks'.
#[derive(Debug)]
pub(crate) struct Scripts {
    /// In the order of [`Algorithm::ALL`].
    one: [Script; Algorithm::ALL.len()],
    check: Script,
    pub(crate) inspect: Script,
    pub(crate) settle: Script,
    pub(crate) renew: Script,
    pub(crate) library: Library,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        let library = Library::new();
        Self {
            one: Algorithm::ALL.map(|algorithm| {
                Script::new(one_source(algorithm)).in_library(&library, algorithm.tag())
            }),
            check: Script::new(CHECK).in_library(&library, "check"),
            inspect: Script::new(INSPECT),
            settle: Script::new(SETTLE),
            renew: Script::new(RENEW),
            library,
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

    #[test]
    fn the_library_registers_the_function_of_every_check_script() {
        let scripts = Scripts::new();
        let source = scripts.library.source();
        let name = &scripts.library.name;
        assert!(source.starts_with(&format!("#!lua name={name}\n")));
        let checks = Algorithm::ALL.map(Some).into_iter().chain([None]);
        for lean in checks {
            let function = scripts.of(lean).function().expect("a check's function");
            assert!(function.starts_with(name.as_str()), "{function}");
            let registered = format!("redis.register_function('{function}',");
            assert_eq!(source.matches(&registered).count(), 1, "{function}");
        }
        for script in [&scripts.inspect, &scripts.settle, &scripts.renew] {
            assert_eq!(script.function(), None);
        }
    }
}
