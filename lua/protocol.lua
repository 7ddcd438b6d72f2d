-- The wire protocol of check.lua, refund.lua and inspect.lua, written by the client in
-- src/backend/redis/protocol.rs. Only entries call these readers, with their ARGV and KEYS; they
-- build no table but a ban's numbers.
--
-- ARGV: the time (us, or '' for Redis TIME), the number of requests, then each request: its
-- cost, its number of policies, its flags (ONCE, RESERVE, TAKEN_AT), the request id's window
-- (ms) when ONCE, the reservation's time (us) when TAKEN_AT; then each policy: algorithm, limit,
-- window (ms), burst, its flags (OVERRIDES, BAN, DELAY), then the ban's after, within, for and
-- max (ms) when BAN, the longest delay (ms) when DELAY.
-- KEYS: each request's request id key when ONCE, then its policies' in order, each its key, its
-- override key when OVERRIDES, and its strikes and ban keys when BAN.

-- The header of the request whose arguments start at argv[a]: its cost, number of policies,
-- whether it is a reservation, the request id's window (ms) or nil, the reservation's time
-- (us) or nil, and where its policies' arguments begin.
local function read_header(argv, a)
  local cost, count, flags = tonumber(argv[a]), tonumber(argv[a + 1]), tonumber(argv[a + 2])
  a = a + 3
  local once_window, taken_at = nil, nil
  if flags % (2 * ONCE) >= ONCE then
    once_window = argv[a]
    a = a + 1
  end
  if flags % (2 * TAKEN_AT) >= TAKEN_AT then
    taken_at = tonumber(argv[a])
    a = a + 1
  end
  return cost, count, flags % (2 * RESERVE) >= RESERVE, once_window, taken_at, a
end

-- The policy whose arguments start at argv[a] and keys at keys[k]: its algorithm, the key and
-- numbers its client is checked by (an override's, when it reads one in force), whether it
-- reads overrides, its ban's numbers (or nil) with its strikes and ban keys, delay mode's slack
-- (us, or nil), and where the next policy's arguments and keys begin. With skip, only where the
-- next begins, reading nothing from Redis (a retry answered from memory).
local function read_policy(argv, keys, a, k, skip)
  local name, limit, window, burst = argv[a], tonumber(argv[a + 1]), tonumber(argv[a + 2]), tonumber(argv[a + 3])
  local flags, key = tonumber(argv[a + 4]), keys[k]
  a, k = a + 5, k + 1
  local overridable = flags % (2 * OVERRIDES) >= OVERRIDES
  if overridable then
    if not skip then
      key, limit, window, burst = marks_of().overridden(keys[k], key, limit, window, burst)
    end
    k = k + 1
  end
  local ban, skey, bkey, slack = nil, nil, nil, nil
  if flags % (2 * BAN) >= BAN then
    ban = { tonumber(argv[a]), tonumber(argv[a + 1]), tonumber(argv[a + 2]), tonumber(argv[a + 3]) }
    skey, bkey = keys[k], keys[k + 1]
    a, k = a + 4, k + 2
  end
  if flags % (2 * DELAY) >= DELAY then
    slack = tonumber(argv[a]) * 1000
    a = a + 1
  end
  return name, key, limit, window, burst, overridable, ban, skey, bkey, slack, a, k
end
