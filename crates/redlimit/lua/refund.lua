-- Entry giving back what an admitted reservation took, for a response that should not count.
-- KEYS: as several.lua, without the idempotency key. ARGV: now (see clock), cost, then four per policy: algorithm tag, limit, window
-- (ms), burst; then the reservation's time in microseconds.
-- Each algorithm gives back at most cost, only to the state the reservation counted in (the same
-- window; for a sliding log, entries stamped with its time), and never below empty.
-- Reply: { how many policies gave something back }.

-- Counts in the window holding at (ms): a newer window owes the reservation nothing.
local function refund_window(key, window, at, cost)
  local start, n = ints(key, redis.call('HMGET', key, 's', 'n'))
  if start == nil or at < start or at >= start + window or n == 0 then
    return 0
  end
  redis.call('HSET', key, 'n', n - min(n, cost))
  return 1
end

local function refund_counter(key, window, at, cost)
  local stored, p, c = ints(key, redis.call('HMGET', key, 'w', 'p', 'c'))
  local index = div(at, window)
  if stored == index and c > 0 then
    redis.call('HSET', key, 'c', c - min(c, cost))
  elseif stored == index + 1 and p > 0 then
    redis.call('HSET', key, 'p', p - min(p, cost))
  else
    return 0
  end
  return 1
end

local function refund_log(key, at, cost)
  local entries = redis.call('ZRANGEBYSCORE', key, at, at, 'LIMIT', 0, cost)
  if #entries == 0 then
    return 0
  end
  redis.call('ZREM', key, unpack(entries))
  return 1
end

local function refund_bucket(key, window, burst, cost)
  local tokens = ints(key, redis.call('HMGET', key, 't', 'l'))
  if tokens == nil then
    return 0
  end
  redis.call('HSET', key, 't', min(tokens + cost * window, burst * window))
  return 1
end

local function refund_gcra(key, limit, window, now_us, cost)
  local tat = int(key, redis.call('GET', key))
  if tat == nil or tat <= now_us then
    return 0
  end
  redis.call('SET', key, str(max(tat - cost * ceil_div(window * 1000, limit), now_us)), 'KEEPTTL')
  return 1
end

local cost, at_us = tonumber(ARGV[2]), tonumber(ARGV[#ARGV])
local at = div(at_us, 1000)
local now_us = clock()
local policies = div(#ARGV - 3, 4)
local refunded, cursor = 0, policies
for i = 1, policies do
  local base = 2 + (i - 1) * 4
  local key, limit, window, burst =
    KEYS[i], tonumber(ARGV[base + 2]), tonumber(ARGV[base + 3]), tonumber(ARGV[base + 4])
  local tag, overridable, ban, m = policy_tag(ARGV[base + 1])
  if overridable then
    cursor = cursor + 1
    key, limit, window, burst = m.overridden(KEYS[cursor], key, limit, window, burst)
  end
  if ban then
    cursor = cursor + 2
  end
  if tag == 'fw' or tag == 'fwa' then
    refunded = refunded + refund_window(key, window, at, cost)
  elseif tag == 'swc' then
    refunded = refunded + refund_counter(key, window, at, cost)
  elseif tag == 'swl' then
    refunded = refunded + refund_log(key, at, cost)
  elseif tag == 'tb' then
    refunded = refunded + refund_bucket(key, window, burst, cost)
  elseif tag == 'gcra' then
    refunded = refunded + refund_gcra(key, limit, window, now_us, cost)
  end
end
return { refunded }
