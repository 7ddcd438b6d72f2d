//! The command line of `redlimit`: a command, then `--flag value` pairs.

use std::collections::HashMap;

/// What `redlimit` was asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Command {
    /// Show one client's state on one route, consuming nothing.
    Inspect,
    /// Delete one client's state on one route.
    Reset,
    /// Check (and consume) one request of a client on one route.
    Check,
    /// The clients of one route closest to or over their limit.
    Top,
    /// Per route, the distribution of per-client usage and a suggested limit.
    Suggest,
    /// Give one client of a route other numbers for a while, for every instance.
    Override,
    /// End one client's override on a route.
    ClearOverride,
}

/// The parsed command line.
#[derive(Debug, Clone)]
pub(crate) struct Args {
    /// The command.
    pub(crate) command: Command,
    flags: HashMap<&'static str, String>,
    /// `--json`.
    pub(crate) json: bool,
}

/// Flags that take a value, and which commands take them.
const FLAGS: [&str; 16] = [
    "--config",
    "--policy",
    "--rls",
    "--domain",
    "--descriptor",
    "--prefix",
    "--route",
    "--client",
    "--redis",
    "--count",
    "--scan-calls",
    "--headroom",
    "--limit",
    "--window",
    "--burst",
    "--ttl",
];

impl Args {
    /// Parses the arguments after the program's name.
    ///
    /// # Errors
    /// A message naming the unknown command or flag, or the missing value.
    pub(crate) fn parse(args: &[String]) -> Result<Self, String> {
        let (command, rest) = args.split_first().ok_or("a command is needed")?;
        let command = match command.as_str() {
            "inspect" => Command::Inspect,
            "reset" => Command::Reset,
            "check" => Command::Check,
            "top" => Command::Top,
            "suggest" => Command::Suggest,
            "override" => Command::Override,
            "clear-override" => Command::ClearOverride,
            other => return Err(format!("unknown command {other:?}")),
        };
        let mut flags = HashMap::new();
        let mut json = false;
        let mut rest = rest.iter();
        while let Some(flag) = rest.next() {
            if flag == "--json" {
                json = true;
                continue;
            }
            let name = FLAGS
                .iter()
                .find(|known| **known == flag)
                .ok_or_else(|| format!("unknown flag {flag:?}"))?;
            let value = rest.next().ok_or_else(|| format!("{flag} needs a value"))?;
            if flags.insert(*name, value.clone()).is_some() {
                return Err(format!("{flag} is given twice"));
            }
        }
        let args = Self {
            command,
            flags,
            json,
        };
        // A demo's file, one policy named here for any application's keys, or a rate limit
        // service's configuration.
        let sources = ["--config", "--policy", "--rls"].map(|flag| args.flag(flag).is_some());
        // With --rls, the descriptor names the client.
        let named_client = match sources {
            [false, false, false] => {
                return Err("--config (or --policy, or --rls) is needed".to_owned());
            }
            [true, false, false] => {
                if args.command != Command::Suggest {
                    args.require("--route")?;
                }
                false
            }
            [false, true, false] => {
                args.require("--redis")?;
                false
            }
            [false, false, true] => {
                args.require("--redis")?;
                args.require("--domain")?;
                args.require("--descriptor")?;
                if matches!(args.command, Command::Suggest) {
                    return Err("suggest reads a demo's file (--config), not --rls".to_owned());
                }
                true
            }
            _ => return Err("give one of --config, --policy and --rls".to_owned()),
        };
        if !named_client
            && matches!(
                args.command,
                Command::Inspect
                    | Command::Reset
                    | Command::Check
                    | Command::Override
                    | Command::ClearOverride
            )
        {
            args.require("--client")?;
        }
        if args.command == Command::Override {
            args.require("--ttl")?;
        }
        Ok(args)
    }

    fn require(&self, flag: &str) -> Result<&str, String> {
        self.flag(flag)
            .ok_or_else(|| format!("{flag} is needed for this command"))
    }

    /// The value of `flag`, if given.
    pub(crate) fn flag(&self, flag: &str) -> Option<&str> {
        self.flags.get(flag).map(String::as_str)
    }

    /// The value of `flag` as a number, or `default`.
    ///
    /// # Errors
    /// A value that is not such a number.
    pub(crate) fn number<T: std::str::FromStr>(&self, flag: &str, default: T) -> Result<T, String> {
        self.flag(flag).map_or(Ok(default), |value| {
            value
                .parse()
                .map_err(|_| format!("{flag}: {value:?} is not a number"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<Args, String> {
        let args: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
        Args::parse(&args)
    }

    #[test]
    fn every_command_names_what_it_lacks() {
        let ok = parse("inspect --config f --route /a --client k --redis redis://x").expect("ok");
        let rls = parse("reset --rls d --domain e --descriptor k=v --redis r").expect("ok");
        assert_eq!(rls.flag("--descriptor"), Some("k=v"));
        assert_eq!(ok.command, Command::Inspect);
        assert_eq!(ok.flag("--redis"), Some("redis://x"));
        assert!(parse("suggest --config f --json").expect("ok").json);
        for (line, says) in [
            ("", "a command"),
            ("frob --config f", "frob"),
            ("top --route /a", "--config"),
            ("top --policy a:gcra:5/1m", "--redis"),
            ("top --config f --policy a:gcra:5/1m --route /a", "one of"),
            ("inspect --rls d --domain e --redis r", "--descriptor"),
            ("inspect --rls d --descriptor k=v --redis r", "--domain"),
            (
                "suggest --rls d --domain e --descriptor k=v --redis r",
                "not --rls",
            ),
            ("top --config f", "--route"),
            ("reset --config f --route /a", "--client"),
            ("top --config f --route /a --colour red", "--colour"),
            ("top --config f --route /a --count", "--count needs a value"),
            ("top --config f --config g --route /a", "twice"),
        ] {
            let err = parse(line).expect_err(line);
            assert!(err.contains(says), "{line}: {err}");
        }
        let top = parse("top --config f --route /a --count ten").expect("parsed");
        assert!(top.number("--count", 10_usize).is_err());
        assert_eq!(top.number("--scan-calls", 7_u64), Ok(7));
    }
}
