//! The bench process's own CPU time (user + system, every thread, those that ended included):
//! what the clients of a mode cost the application, beside what they cost Redis.

use std::time::Duration;

/// Clock ticks per second of `/proc/self/stat`'s times: `USER_HZ`, 100 on every Linux port
/// that this bench runs on.
const TICKS_PER_SECOND: u64 = 100;

/// The process's CPU time so far, from `/proc/self/stat` (Linux); `None` elsewhere.
pub(crate) fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the command name (which may hold spaces, so after its last ')'):
    // state is the first, utime the 12th, stime the 13th.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace().skip(11);
    let mut ticks = || fields.next()?.parse::<u64>().ok();
    let (user, system) = (ticks()?, ticks()?);
    Some(Duration::from_millis(
        (user + system) * 1000 / TICKS_PER_SECOND,
    ))
}
