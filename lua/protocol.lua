-- The wire protocol of check.lua, refund.lua and inspect.lua, written by the client in
-- src/backend/redis/protocol.rs. Only entries call these readers, with their ARGV and KEYS.
--
-- ARGV: the time (us, or '' for Redis TIME), the number of requests, then each request: its
-- cost, its number of policies, its flags (ONCE, RESERVE, TAKEN_AT), the request id's window
-- (ms) when ONCE, the reservation's time (us) when TAKEN_AT; then each policy: algorithm, limit,
-- window (ms), burst, its flags (OVERRIDES, BAN, DELAY), then the ban's after, within, for and
-- max (ms) when BAN, the longest delay (ms) when DELAY.
-- KEYS: each request's policies in order, each its key, then its override key when OVERRIDES,
-- then its strikes and ban keys when BAN; then the request id's key when ONCE.

-- The request whose arguments start at argv[a] and keys at keys[k], and where the next begins.
local function read_request(argv, keys, a, k)
  local request = { cost = tonumber(argv[a]), policies = {} }
  local count, flags = tonumber(argv[a + 1]), tonumber(argv[a + 2])
  a = a + 3
  if has(flags, ONCE) then
    request.once_window = argv[a]
    a = a + 1
  end
  if has(flags, TAKEN_AT) then
    request.taken_at = tonumber(argv[a])
    a = a + 1
  end
  request.reserve = has(flags, RESERVE)
  for i = 1, count do
    local p = {
      algorithm = argv[a],
      limit = tonumber(argv[a + 1]),
      window = tonumber(argv[a + 2]),
      burst = tonumber(argv[a + 3]),
      key = keys[k],
    }
    local pflags = tonumber(argv[a + 4])
    a, k = a + 5, k + 1
    if has(pflags, OVERRIDES) then
      p.okey = keys[k]
      k = k + 1
    end
    if has(pflags, BAN) then
      p.ban = { tonumber(argv[a]), tonumber(argv[a + 1]), tonumber(argv[a + 2]), tonumber(argv[a + 3]) }
      p.skey, p.bkey = keys[k], keys[k + 1]
      a, k = a + 4, k + 2
    end
    if has(pflags, DELAY) then
      p.slack = tonumber(argv[a]) * 1000
      a = a + 1
    end
    request.policies[i] = p
  end
  if has(flags, ONCE) then
    request.idem = keys[k]
    k = k + 1
  end
  return request, a, k
end

-- The key and numbers a policy is checked by for its client: an override's, when it has one.
local function in_force(p)
  if p.okey then
    return marks_of().overridden(p.okey, p.key, p.limit, p.window, p.burst)
  end
  return p.key, p.limit, p.window, p.burst
end
